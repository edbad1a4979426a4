package docs_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The README is what a newcomer reads in five minutes: at most 250 lines,
// each feature of its table linking to its guide under docs/, and every
// page of docs/ reachable from docs/README.md, the index.
func TestReadmeIsShortAndIndexed(t *testing.T) {
	r := root(t)
	b, err := os.ReadFile(filepath.Join(r, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > 250 {
		t.Errorf("README.md has %d lines; move detail into a guide or reference page under docs/ and keep it at most 250", n)
	}
	for _, want := range []string{"```mermaid", "make demo", "make test", "helm install", "certs.mode=cert-manager", "## Layout", "## Contributing", "## License"} {
		if !strings.Contains(readme, want) {
			t.Errorf("README.md lacks %q", want)
		}
	}
	start := strings.Index(readme, "| feature | guide |")
	if start < 0 {
		t.Fatal("README.md has no feature table")
	}
	rows := 0
	for _, line := range strings.Split(readme[start:], "\n")[2:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		rows++
		if !strings.Contains(line, "](docs/") {
			t.Errorf("feature row links to no guide under docs/: %s", line)
		}
	}
	if rows < 8 {
		t.Errorf("the feature table has %d rows", rows)
	}
	index, err := os.ReadFile(filepath.Join(r, "docs", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	all, err := filepath.Glob(filepath.Join(r, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range all {
		name := filepath.Base(p)
		if name != "README.md" && !strings.Contains(string(index), "]("+name) {
			t.Errorf("docs/README.md does not link %s", name)
		}
	}
}
