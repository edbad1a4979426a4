package framework

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// CheckDocTable compares a table a test observed (header, its separator
// made here, and rows) with the one between docs/peers.md's
// <!-- name-table:begin --> and <!-- name-table:end --> markers, or writes
// it there with KVNET_UPDATE_DOCS=1. The peers' tables are what the tests
// saw, never what their authors expected.
func CheckDocTable(t *testing.T, name string, header []string, rows []string) {
	t.Helper()
	path := filepath.Join(RepoRoot(), "docs", "peers.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+name+"-table:begin -->\n", "<!-- "+name+"-table:end -->"
	i, j := strings.Index(string(b), begin), strings.Index(string(b), end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q markers", path, begin, end)
	}
	table := "| " + strings.Join(header, " | ") + " |\n|" + strings.Repeat("---|", len(header)) + "\n" + strings.Join(rows, "\n") + "\n"
	if os.Getenv("KVNET_UPDATE_DOCS") != "" {
		out := string(b[:i+len(begin)]) + table + string(b[j:])
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := string(b[i+len(begin) : j]); got != table {
		t.Errorf("%s's %s table is not what the test saw (run with KVNET_UPDATE_DOCS=1 to rewrite it):\n%s\nwant:\n%s", path, name, got, table)
	}
}
