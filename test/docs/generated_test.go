package docs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	generated "github.com/kvnet/kvnet/hack/docs/pages"
)

// Every generated reference page is what `make docs` writes from today's
// code and values: a flag, metric, Helm value or config key added,
// renamed or re-described without `make docs` fails
// here, naming the page.
func TestGeneratedPagesAreCurrent(t *testing.T) {
	r := root(t)
	all, err := generated.All(r)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range all {
		got, err := os.ReadFile(filepath.Join(r, name))
		if err != nil {
			t.Fatalf("%v: run make docs", err)
		}
		if string(got) != want {
			gl, wl := strings.Split(string(got), "\n"), strings.Split(want, "\n")
			for i := range min(len(gl), len(wl)) {
				if gl[i] != wl[i] {
					t.Fatalf("%s is stale at line %d:\n got  %q\n want %q\nrun make docs", name, i+1, gl[i], wl[i])
				}
			}
			t.Fatalf("%s is stale (%d lines, want %d): run make docs", name, len(gl), len(wl))
		}
	}
}
