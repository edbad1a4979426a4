// Package imagetest reads the OCI image layout hack/image writes, for the
// two tests that check it: hack/image's own (the builder, two platforms) and
// test/image's (`make image` end to end). Both check a kvnet image the same
// way, so the checks live here once.
package imagetest

import (
	"archive/tar"
	"io"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Index opens the layout at dir, checks that it holds exactly one entry,
// an image index named by tag (what skopeo and crane address as
// oci:<dir>:<tag>), and returns that index and its digest.
func Index(t testing.TB, dir, tag string) (v1.ImageIndex, v1.Hash) {
	t.Helper()
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != tag {
		t.Fatalf("layout index.json = %+v: want one index named by the tag %s", tm.Manifests, tag)
	}
	digest := tm.Manifests[0].Digest
	idx, err := top.ImageIndex(digest)
	if err != nil {
		t.Fatal(err)
	}
	return idx, digest
}

// Images returns the images of an OCI image index by platform
// ("linux/arm/v7"); every entry must name its platform.
func Images(t testing.TB, idx v1.ImageIndex) map[string]v1.Image {
	t.Helper()
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("image index media type %s, want an OCI index", im.MediaType)
	}
	images := map[string]v1.Image{}
	for _, d := range im.Manifests {
		if d.Platform == nil {
			t.Fatalf("image %s names no platform", d.Digest)
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		images[d.Platform.String()] = img
	}
	return images
}

// Config checks what every kvnet image's config says: its own platform,
// the one entrypoint /kvnet, a non-root user, version as the OCI version
// label and Apache-2.0 (LICENSE) as its licenses label. It returns the config for the caller's further checks.
func Config(t testing.TB, platform string, img v1.Image, version string) *v1.ConfigFile {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Platform().String() != platform {
		t.Errorf("%s: config platform %s", platform, cf.Platform())
	}
	if ep := cf.Config.Entrypoint; len(ep) != 1 || ep[0] != "/kvnet" {
		t.Errorf("%s: entrypoint %v, want [/kvnet]", platform, ep)
	}
	if u := cf.Config.User; u == "" || u == "0" || u == "root" || strings.HasPrefix(u, "0:") {
		t.Errorf("%s: user %q: want a non-root user", platform, u)
	}
	if got := cf.Config.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("%s: version label %q, want %q", platform, got, version)
	}
	if got := cf.Config.Labels["org.opencontainers.image.licenses"]; got != "Apache-2.0" {
		t.Errorf("%s: licenses label %q, want Apache-2.0 (the SPDX identifier of LICENSE)", platform, got)
	}
	return cf
}

// File is one regular file or directory of an image's filesystem.
type File struct {
	Content string
	Mode    int64
}

// Files flattens the image's layers into its filesystem, by path without a
// leading "./" ("kvnet", "etc/passwd").
func Files(t testing.TB, img v1.Image) map[string]File {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]File{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(h.Name, "./")] = File{string(data), h.Mode}
	}
}

// NoShell fails the test for every shell (or bin/ directory) in the image:
// kvnet's image is the static binary and a few files of /etc, nothing an
// attacker could run.
func NoShell(t testing.TB, platform string, files map[string]File) {
	t.Helper()
	for name := range files {
		if strings.HasPrefix(name, "bin/") || strings.HasSuffix(name, "/sh") || strings.HasSuffix(name, "/bash") || strings.HasSuffix(name, "/busybox") {
			t.Errorf("%s: image contains %s; want no shell", platform, name)
		}
	}
}
