// Command image builds kvnet's container image without a Docker engine:
// static binaries (built by `make image`) plus a tiny base (rootfs/) become
// an OCI image index, one image per platform, written as an OCI image
// layout that `crane push <dir> <ref>` or `skopeo copy --all
// oci:<dir>:<tag> docker://<ref>` publishes.
//
// go-containerregistry does the OCI work (digests, media types, the layout's
// index.json) so none of that format is written by hand here. The
// Dockerfile at the repository root builds the same image with Docker.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	var (
		s       = Spec{Binaries: map[string]string{}}
		dir     string
		created string
	)
	flag.StringVar(&dir, "layout", "bin/image", "directory to write the OCI image layout to (replaced)")
	flag.StringVar(&s.Ref, "ref", "", "image name and tag, e.g. ghcr.io/kvnet/kvnet:0.1.0")
	flag.StringVar(&s.Version, "version", "", "version label")
	flag.StringVar(&s.Commit, "commit", "", "commit label")
	flag.StringVar(&created, "created", "0", "creation time and file mtimes, in Unix seconds (SOURCE_DATE_EPOCH)")
	flag.Func("binary", "platform=path of a static kvnet binary, e.g. linux/amd64=bin/linux-amd64/kvnet (repeatable)", func(v string) error {
		p, file, ok := strings.Cut(v, "=")
		if !ok || p == "" || file == "" {
			return fmt.Errorf("want platform=path, got %q", v)
		}
		s.Binaries[p] = file
		return nil
	})
	flag.Parse()
	secs, err := strconv.ParseInt(created, 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: --created %q: want Unix seconds\n", created)
		os.Exit(2)
	}
	s.Created = time.Unix(secs, 0).UTC()
	digest, err := Build(dir, s)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("%s@%s written to %s (OCI layout)\n", s.Ref, digest, dir)
}
