package docs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/docgen"
)

// Every generated reference page is what `make docs` writes from today's
// code: a flag added, renamed or re-described without `make docs` fails
// here, naming the page.
func TestGeneratedPagesAreCurrent(t *testing.T) {
	r := root(t)
	var reg docgen.Recorder
	if err := app.RegisterMetrics(&reg); err != nil {
		t.Fatal(err)
	}
	metrics, err := docgen.Metrics(&reg)
	if err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(filepath.Join(r, "charts", "kvnet", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	helm, err := docgen.HelmValues(values)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"cli.md":         docgen.CLI(app.RootCommand()),
		"metrics.md":     metrics,
		"helm-values.md": helm,
	} {
		got, err := os.ReadFile(filepath.Join(r, "docs", name))
		if err != nil {
			t.Fatalf("%v: run make docs", err)
		}
		if string(got) != want {
			gl, wl := strings.Split(string(got), "\n"), strings.Split(want, "\n")
			for i := range min(len(gl), len(wl)) {
				if gl[i] != wl[i] {
					t.Fatalf("docs/%s is stale at line %d:\n got  %q\n want %q\nrun make docs", name, i+1, gl[i], wl[i])
				}
			}
			t.Fatalf("docs/%s is stale (%d lines, want %d): run make docs", name, len(gl), len(wl))
		}
	}
}
