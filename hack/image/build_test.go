package main

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Two platforms give an OCI index with one image per platform, each with
// the nonroot user, the entrypoint, its own binary and no shell; the same
// inputs give the same digest (the build is reproducible).
func TestBuildMultiPlatform(t *testing.T) {
	tmp := t.TempDir()
	bins := map[string]string{}
	for _, p := range []string{"linux/amd64", "linux/arm/v7"} {
		f := filepath.Join(tmp, strings.ReplaceAll(p, "/", "-"))
		if err := os.WriteFile(f, []byte("binary for "+p), 0o600); err != nil {
			t.Fatal(err)
		}
		bins[p] = f
	}
	spec := Spec{Binaries: bins, Ref: "registry.local:5000/kvnet/kvnet:1.2.3", Version: "1.2.3", Commit: "abc", Created: time.Unix(1700000000, 0).UTC()}
	dir := filepath.Join(tmp, "layout")
	digest, err := Build(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(filepath.Join(tmp, "again"), spec)
	if err != nil || again != digest {
		t.Errorf("second build: %v, %v; want the same digest %v", again, err, digest)
	}

	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	top, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	topm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(topm.Manifests) != 1 || topm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "1.2.3" || topm.Manifests[0].Digest != digest {
		t.Fatalf("layout index.json = %+v: want one index named by the tag 1.2.3", topm.Manifests)
	}
	idx, err := top.ImageIndex(digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != "application/vnd.oci.image.index.v1+json" || len(im.Manifests) != 2 {
		t.Fatalf("index: media type %s, %d manifests; want an OCI index of 2", im.MediaType, len(im.Manifests))
	}
	for _, d := range im.Manifests {
		plat := d.Platform.String()
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Platform().String() != plat {
			t.Errorf("%s: config platform %s", plat, cf.Platform())
		}
		if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != "/kvnet" {
			t.Errorf("%s: entrypoint %v", plat, got)
		}
		if cf.Config.User != "65532:65532" {
			t.Errorf("%s: user %q, want 65532:65532", plat, cf.Config.User)
		}
		if cf.Config.Labels["org.opencontainers.image.version"] != "1.2.3" || cf.Config.Labels["org.opencontainers.image.revision"] != "abc" {
			t.Errorf("%s: labels %v", plat, cf.Config.Labels)
		}
		files := filesOf(t, img)
		if files["kvnet"].content != "binary for "+plat || files["kvnet"].mode != 0o755 {
			t.Errorf("%s: /kvnet = %+v", plat, files["kvnet"])
		}
		if !strings.Contains(files["etc/passwd"].content, ":65532:65532:") {
			t.Errorf("%s: /etc/passwd lacks the nonroot user: %q", plat, files["etc/passwd"].content)
		}
		for name := range files {
			if strings.HasPrefix(name, "bin/") || strings.HasSuffix(name, "/sh") {
				t.Errorf("%s: image contains %s; want no shell", plat, name)
			}
		}
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{Ref: "kvnet:1"}, "--binary"},
		{Spec{Binaries: map[string]string{"linux/amd64": "x"}, Ref: "localhost:5000/kvnet"}, "--ref"},
		{Spec{Binaries: map[string]string{"linux/amd64": filepath.Join(t.TempDir(), "missing")}, Ref: "kvnet:1"}, "missing"},
	} {
		if _, err := Build(t.TempDir(), tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Build(%+v) = %v, want an error naming %s", tc.spec, err, tc.want)
		}
	}
}

// The Dockerfile builds the same image: same user, entrypoint, binary
// path, base files and labels as Build.
func TestDockerfileMatchesBuild(t *testing.T) {
	f, err := os.Open("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var final []string // instructions of the last stage
	sc := bufio.NewScanner(f)
	cont := ""
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont += strings.TrimSuffix(line, "\\") + " "
			continue
		}
		line, cont = cont+line, ""
		if strings.HasPrefix(line, "FROM ") {
			final = nil
		}
		final = append(final, line)
	}
	joined := strings.Join(final, "\n")
	ep, _ := json.Marshal([]string{BinaryPath})
	for _, want := range []string{
		"FROM scratch",
		"USER " + User,
		"ENTRYPOINT " + string(ep),
		"COPY hack/image/rootfs/ /",
		"COPY --from=build --chmod=0755 /out/kvnet " + BinaryPath,
		"org.opencontainers.image.version=$VERSION",
		"org.opencontainers.image.revision=$COMMIT",
		"org.opencontainers.image.title=kvnet",
		"org.opencontainers.image.source=https://github.com/kvnet/kvnet",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("Dockerfile's final stage lacks %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "RUN ") {
		t.Errorf("Dockerfile's final stage runs a command; the image has no shell:\n%s", joined)
	}
}

type file struct {
	content string
	mode    int64
}

func filesOf(t *testing.T, img v1.Image) map[string]file {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]file{}
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
		files[h.Name] = file{string(data), h.Mode}
	}
}
