package layout_test

import (
	"go/ast"
	"go/token"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/config"
)

// requestPaths are the packages an admission request runs through: what
// they return as an error the webhook answers with a 500.
var requestPaths = []string{"internal/chain", "mutators", "validators", "webhook", "internal/migration"}

// A config value is parsed and refused when the config loads, so no
// request path returns an error about one: an error whose text starts
// with a config key ("persistentIPs.primaryUDN...", "migration.inCluster...")
// would be a 500 on every request for the admin's mistake. The config's
// top-level keys are read from config.Config's JSON tags, so a new key is
// covered as it comes.
func TestNoConfigErrorOnRequestPaths(t *testing.T) {
	var keys []string
	ct := reflect.TypeFor[config.Config]()
	for i := range ct.NumField() {
		if name, _, _ := strings.Cut(ct.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	if len(keys) < 5 {
		t.Fatalf("config keys %v: config.Config's tags not read", keys)
	}
	found := 0
	for _, s := range sources(t) {
		if !slices.ContainsFunc(requestPaths, func(p string) bool { return within(s.dir, p) }) {
			continue
		}
		found++
		ast.Inspect(s.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !((isIdent(sel.X, "fmt") && sel.Sel.Name == "Errorf") || (isIdent(sel.X, "errors") && sel.Sel.Name == "New")) {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			text, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, k := range keys {
				if strings.HasPrefix(text, k+".") || strings.HasPrefix(text, k+"[") || strings.HasPrefix(text, k+":") {
					t.Errorf("%s: returns an error about config key %s (%q): refuse the value when the config loads", s.path, k, text)
				}
			}
			return true
		})
	}
	if found < 20 {
		t.Fatalf("read %d files of the request paths; is this the repository?", found)
	}
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}
