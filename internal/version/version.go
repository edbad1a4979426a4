// Package version holds what `kvnet version` prints. Version and Commit are
// set at link time by the Makefile (-ldflags -X); a plain `go build` leaves
// the defaults, which say so rather than guess.
package version

import (
	"fmt"
	"runtime"
)

// Set with -ldflags "-X github.com/kvnet/kvnet/internal/version.Version=... -X ...Commit=...".
// The Makefile takes Version from charts/kvnet/Chart.yaml's appVersion, so the
// binary, the image tag and the chart's default image always agree.
var (
	Version = "dev"
	Commit  = "unknown"
)

// Info is the build's identity, printed by `kvnet version` and logged at start.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get returns the identity of the running binary.
func Get() Info {
	return Info{
		Version:   Version,
		Commit:    Commit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// String is the one-line form: "kvnet 0.1.0 (commit abc123, go1.26.8, linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("kvnet %s (commit %s, %s, %s)", i.Version, i.Commit, i.GoVersion, i.Platform)
}
