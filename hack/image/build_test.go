package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvnet/kvnet/hack/image/imagetest"
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

	idx, got := imagetest.Index(t, dir, "1.2.3")
	if got != digest {
		t.Fatalf("layout names index %v; Build returned %v", got, digest)
	}
	images := imagetest.Images(t, idx)
	if len(images) != 2 {
		t.Fatalf("index holds %d images; want one for each of the 2 platforms", len(images))
	}
	for plat, img := range images {
		cf := imagetest.Config(t, plat, img, "1.2.3")
		if cf.Config.User != User {
			t.Errorf("%s: user %q, want %s", plat, cf.Config.User, User)
		}
		if cf.Config.Labels["org.opencontainers.image.revision"] != "abc" {
			t.Errorf("%s: labels %v", plat, cf.Config.Labels)
		}
		files := imagetest.Files(t, img)
		if files["kvnet"].Content != "binary for "+plat || files["kvnet"].Mode != 0o755 {
			t.Errorf("%s: /kvnet = %+v", plat, files["kvnet"])
		}
		if !strings.Contains(files["etc/passwd"].Content, ":65532:65532:") {
			t.Errorf("%s: /etc/passwd lacks the nonroot user: %q", plat, files["etc/passwd"].Content)
		}
		imagetest.NoShell(t, plat, files)
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
		"org.opencontainers.image.licenses=" + License,
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("Dockerfile's final stage lacks %q:\n%s", want, joined)
		}
	}
	if strings.Contains(joined, "RUN ") {
		t.Errorf("Dockerfile's final stage runs a command; the image has no shell:\n%s", joined)
	}
}
