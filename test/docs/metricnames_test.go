package docs_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/docgen"
)

var metricName = regexp.MustCompile(`\bkvnet_[a-z0-9_]+[a-z0-9]`)

// Every kvnet metric a page names is one kvnet registers (a histogram's
// _bucket, _sum and _count included): a guide that sends a user to a
// metric that does not exist, or no longer does, fails here.
func TestDocsNameOnlyRealMetrics(t *testing.T) {
	var reg docgen.Recorder
	if err := app.RegisterMetrics(&reg); err != nil {
		t.Fatal(err)
	}
	page, err := docgen.Metrics(&reg)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, n := range metricName.FindAllString(page, -1) {
		for _, s := range []string{"", "_bucket", "_sum", "_count"} {
			known[n+s] = true
		}
	}
	r := root(t)
	unknown := map[string][]string{}
	for _, p := range pages(t, r) {
		b, err := os.ReadFile(filepath.Join(r, p))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range metricName.FindAllString(string(b), -1) {
			if !known[n] && !strings.HasSuffix(n, "_") {
				unknown[n] = append(unknown[n], p)
			}
		}
	}
	var names []string
	for n := range unknown {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Errorf("%s, named in %v, is no metric kvnet registers", n, unknown[n])
	}
}
