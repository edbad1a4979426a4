// Package layout checks the shape of the tree that docs/architecture.md
// ("Layout and import rules") describes: which folders hold Go code, which
// kvnet packages each may import, and that no package wires itself up in
// an init function. It reads the sources, so it needs no cluster.
package layout_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/kvnet/kvnet/"

// topLevel are the folders that may hold Go code: the card's, and internal/
// and hack/.
var topLevel = []string{
	"certs", "cmd", "hack", "internal", "mutators", "test", "validators", "webhook",
}

// mayImport says which kvnet packages the non-test code of a folder may
// import, by path prefix. A package takes the rule of its longest matching
// folder; a folder without a rule fails the test, so a new one comes with
// its rule. "*" is anything. Packages under one rule's folder may import
// each other (certs/certstest imports certs).
var mayImport = map[string][]string{
	// Leaves: the model, and helpers that know nothing of kvnet.
	"internal/model": {"internal/model"},
	// An annotation's network is a config network, validated as one.
	"internal/model/requested": {"internal/model", "internal/config"},
	"internal/metrics":         {},
	"internal/metricsauth":     {},
	"internal/benchmark":       {},
	"internal/version":         {},
	"internal/apijson":         {},
	"internal/patch":           {},
	"internal/docgen":          {},
	"internal/peerwebhook":     {},

	// What admission and the controllers read: policy and cluster facts.
	"internal/config": {"internal/model", "internal/metrics"},
	"internal/lookup": {"internal/model"},

	// Admission machinery, then the steps it runs.
	"internal/chain": {"internal/apijson", "internal/config", "internal/lookup", "internal/metrics", "internal/model"},
	"mutators":       {"internal/chain", "internal/config", "internal/lookup", "internal/metrics", "internal/model", "internal/persistentips"},
	"validators":     {"internal/chain", "internal/config", "internal/lookup", "internal/model", "internal/persistentips"},
	// The edge serves whatever chains it is given: never mutators,
	// validators or a controller.
	"webhook":          {"internal/chain", "internal/patch", "internal/apijson", "internal/config", "internal/lookup", "internal/metrics", "internal/model"},
	"internal/offline": {"internal/config", "internal/lookup", "internal/model"},

	// Controllers and the proxy: they may use the admission machinery, not
	// each other, and not the steps.
	"internal/persistentips": {"internal/config", "internal/lookup", "internal/metrics", "internal/model"},
	"internal/migration":     {"internal/chain", "internal/config", "internal/metrics", "internal/model"},
	"certs":                  {"internal/metrics"},
	"internal/proxy":         {"webhook", "internal/apijson", "internal/metrics", "internal/model"},
	// The hop's wire protocol reads what a peer sends: it imports none of
	// the proxy's other packages, only the model.
	"internal/proxy/hop": {"internal/model"},
	// The proxy's ConfigMaps: what they hold, not who reads it.
	"internal/proxy/store": {},
	// The CA exchange: what the hop carries, and its own metrics.
	"internal/proxy/caexchange": {"internal/proxy/hop", "internal/metrics"},

	// Wiring, tools and tests: anything.
	"cmd":  {"*"},
	"hack": {"*"},
	"test": {"*"},
}

// source is one non-test Go file of the module.
type source struct {
	dir  string // relative to the repository root, with slashes
	file *ast.File
	path string
}

func sources(t *testing.T) []source {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	var out []source
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || rel == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		out = append(out, source{dir: filepath.ToSlash(filepath.Dir(rel)), file: f, path: filepath.ToSlash(rel)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 100 {
		t.Fatalf("found %d Go files under %s; is this the repository?", len(out), root)
	}
	return out
}

// rule returns the folder whose rule applies to dir.
func rule(dir string) (string, bool) {
	best := ""
	for folder := range mayImport {
		if (dir == folder || strings.HasPrefix(dir, folder+"/")) && len(folder) > len(best) {
			best = folder
		}
	}
	return best, best != ""
}

func within(pkg, prefix string) bool {
	return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
}

func TestTopLevelFolders(t *testing.T) {
	var got []string
	for _, s := range sources(t) {
		top, _, _ := strings.Cut(s.dir, "/")
		if top == "." {
			t.Errorf("%s: Go code at the top level", s.path)
			continue
		}
		if !slices.Contains(got, top) {
			got = append(got, top)
		}
	}
	for _, top := range got {
		if !slices.Contains(topLevel, top) {
			t.Errorf("top-level folder %s/ holds Go code; the layout (docs/architecture.md) has no place for it", top)
		}
	}
}

func TestImportRules(t *testing.T) {
	for _, s := range sources(t) {
		folder, ok := rule(s.dir)
		if !ok {
			t.Errorf("%s: no import rule covers %s/; add it to mayImport and docs/architecture.md", s.path, s.dir)
			continue
		}
		allowed := mayImport[folder]
		if slices.Contains(allowed, "*") {
			continue
		}
		for _, imp := range s.file.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			pkg, ok := strings.CutPrefix(p, module)
			if !ok || within(pkg, folder) {
				continue
			}
			if !slices.ContainsFunc(allowed, func(a string) bool { return within(pkg, a) }) {
				t.Errorf("%s imports %s; code under %s/ may import only %v", s.path, pkg, folder, allowed)
			}
		}
	}
}

// TestNoInit: packages do not register or start anything on import;
// cmd/kvnet/app calls each package's setup (RegisterMetrics, Setup...)
// explicitly.
func TestNoInit(t *testing.T) {
	for _, s := range sources(t) {
		for _, d := range s.file.Decls {
			if f, ok := d.(*ast.FuncDecl); ok && f.Recv == nil && f.Name.Name == "init" {
				t.Errorf("%s: func init(); give the package a function cmd/kvnet/app calls instead", s.path)
			}
		}
	}
}

// TestRulesMatchTheDocs: every folder with a rule is named in the doc's
// import rules, so the doc and the test cannot drift apart.
func TestRulesMatchTheDocs(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rules, ok := strings.Cut(string(b), "## Layout and import rules")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## Layout and import rules" section`)
	}
	rules, _, _ = strings.Cut(rules, "\n## ")
	for folder := range mayImport {
		if !strings.Contains(rules, "`"+folder+"/`") {
			t.Errorf("docs/architecture.md's import rules do not name `%s/`", folder)
		}
	}
}

// The Makefile's race tier names integration tests by a regular
// expression; a test renamed or removed would silently drop out of it. Each
// name it lists must be a test function of test/.
func TestRaceTierNamesExist(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var expr string
	for _, line := range strings.Split(string(mk), "\n") {
		if v, ok := strings.CutPrefix(line, "RACE_INTEGRATION ?= "); ok {
			expr = v
		}
	}
	inner, ok := strings.CutPrefix(expr, "^(")
	inner, ok2 := strings.CutSuffix(inner, ")$$")
	if !ok || !ok2 || inner == "" {
		t.Fatalf("RACE_INTEGRATION is %q, want ^(TestA|TestB|...)$$", expr)
	}
	defined := map[string]bool{}
	files, err := filepath.Glob(filepath.Join("..", "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
				defined[fn.Name.Name] = true
			}
		}
	}
	for _, name := range strings.Split(inner, "|") {
		if !defined[name] {
			t.Errorf("RACE_INTEGRATION names %s, which is no test function of test/", name)
		}
	}
}

// notLinked are module paths the kvnet binary must not link, each with
// why. controller-runtime's metrics filters (k8s.io/apiserver's delegating
// authenticator and authorizer) brought all of them in: 30 MB of an 83 MB
// binary, whose touched pages are most of a webhook's resident memory;
// internal/metricsauth does the same job with two API calls.
var notLinked = map[string]string{
	"k8s.io/apiserver/":          "the API server's libraries (use internal/metricsauth for metrics authorization)",
	"github.com/google/cel-go/":  "CEL, which only k8s.io/apiserver's authorizers need",
	"google.golang.org/grpc":     "gRPC, which only k8s.io/apiserver's egress selector needs",
	"go.opentelemetry.io/":       "OpenTelemetry, which only k8s.io/apiserver's tracing needs",
	"github.com/antlr4-go/antlr": "ANTLR, CEL's parser",
}

// TestBinaryLinksNoAPIServer: `go list -deps ./cmd/kvnet` holds none of
// notLinked, so that a new import cannot bring back the megabytes that were
// cut (docs/performance.md, "Memory").
func TestBinaryLinksNoAPIServer(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./cmd/kvnet")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/kvnet: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps ./cmd/kvnet gave %d packages; want the binary's whole graph", len(deps))
	}
	for _, p := range deps {
		for prefix, why := range notLinked {
			if strings.HasPrefix(p, prefix) {
				t.Errorf("the kvnet binary links %s: %s", p, why)
			}
		}
	}
}
