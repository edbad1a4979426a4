package framework

import (
	"fmt"
	"os"
	"path/filepath"
)

// PrometheusTool locates prometheus or promtool, which hack/prometheus.sh
// builds from Prometheus' Go module: in $KVNET_PROMETHEUS_DIR (the Makefile
// sets it to the pinned version's folder), else in bin/tools/prometheus (the
// last version built). A missing binary is an error saying how to get it, so
// the tests that need it fail rather than skip.
func PrometheusTool(name string) (string, error) {
	dir := os.Getenv("KVNET_PROMETHEUS_DIR")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "bin", "tools", "prometheus")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found in %s: run `make prometheus` (hack/prometheus.sh builds it from Prometheus' Go module) first", name, dir)
	}
	return p, nil
}
