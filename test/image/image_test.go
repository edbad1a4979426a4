// Package image tests `make image` end to end: the OCI layout it writes is
// loaded the way crane or skopeo would, its config is checked, and the
// kvnet binary is taken out of the layer and run. It also checks that the
// chart's default image is the one the Makefile builds.
package image

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/hack/image/imagetest"
	"github.com/kvnet/kvnet/test/framework"
)

var root = framework.RepoRoot()

// appVersion reads the chart's appVersion: the one version number kvnet has.
func appVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "charts", "kvnet", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(data, &c); err != nil || c.AppVersion == "" {
		t.Fatalf("Chart.yaml appVersion: %q, %v", c.AppVersion, err)
	}
	return c.AppVersion
}

func command(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// The chart, rendered with its defaults, runs exactly the image `make
// image` names: same repository, tag = the chart's appVersion.
func TestChartDefaultImageIsMakefileImage(t *testing.T) {
	helm := os.Getenv("HELM")
	if helm == "" {
		helm = filepath.Join(root, "bin", "tools", "helm")
	}
	ref := command(t, "make", "-s", "image-ref")
	if want := "ghcr.io/kvnet/kvnet:" + appVersion(t); ref != want {
		t.Errorf("make image-ref = %q, want %q (tag = Chart.yaml appVersion)", ref, want)
	}
	cmd := exec.Command(helm, "template", "kvnet", filepath.Join(root, "charts", "kvnet"), "-n", "kvnet-system", "--kube-version", framework.K8sVersion)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template (helm at %s; make helm builds it): %v", helm, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	found := 0
	for {
		var d appsv1.Deployment
		if err := dec.Decode(&d); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if d.Kind != "Deployment" {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			found++
			if c.Image != ref {
				t.Errorf("Deployment %s container %s runs %q; make image builds %q", d.Name, c.Name, c.Image, ref)
			}
		}
	}
	if found == 0 {
		t.Fatal("helm template rendered no Deployment container")
	}
}

// `make image` for this machine's platform: the layout loads, the image is
// the host platform's, runs /kvnet as a non-root user, has no shell, holds
// a static binary, and that binary reports the chart's version and the
// checked-out commit.
func TestMakeImage(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "layout")
	plat := "linux/" + runtime.GOARCH
	// The release build (static, -trimpath): the first run compiles kvnet's
	// dependencies once more with CGO_ENABLED=0; the build cache keeps them.
	command(t, "make", "-s", "image", "IMAGE_LAYOUT="+dir, "IMAGE_BUILD="+filepath.Join(tmp, "build"), "PLATFORMS="+plat)

	idx, _ := imagetest.Index(t, dir, appVersion(t))
	images := imagetest.Images(t, idx)
	img, ok := images[plat]
	if len(images) != 1 || !ok {
		t.Fatalf("image index holds images for %v; want one for %s", slices.Collect(maps.Keys(images)), plat)
	}
	imagetest.Config(t, plat, img, appVersion(t))

	// Take /kvnet out of the image's filesystem.
	files := imagetest.Files(t, img)
	imagetest.NoShell(t, plat, files)
	bin, ok := files["kvnet"]
	if !ok {
		t.Fatal("no /kvnet in the image")
	}
	if bin.Mode&0o111 == 0 {
		t.Errorf("/kvnet mode %o: not executable", bin.Mode)
	}

	exe := filepath.Join(tmp, "kvnet")
	if err := os.WriteFile(exe, []byte(bin.Content), 0o755); err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("/kvnet has an ELF interpreter: it is not static")
		}
	}
	ef.Close()

	var info struct{ Version, Commit, GoVersion string }
	out := command(t, exe, "version", "-o", "json")
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("kvnet version -o json: %q: %v", out, err)
	}
	if info.Version != appVersion(t) {
		t.Errorf("image's kvnet version = %q, want the chart's appVersion %q", info.Version, appVersion(t))
	}
	if want := command(t, "git", "rev-parse", "HEAD"); info.Commit != want {
		t.Errorf("image's kvnet commit = %q, want %q", info.Commit, want)
	}
	if !strings.HasPrefix(info.GoVersion, "go1.") {
		t.Errorf("image's kvnet Go version = %q", info.GoVersion)
	}
}
