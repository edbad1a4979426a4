package docgen_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/docgen"
)

type (
	testConfig struct {
		// Rules are applied in order.
		Rules []testRule `json:"rules,omitempty"`
		// Timeout is how long.
		Timeout    *testDuration `json:"timeout,omitempty"`
		testInline `json:",inline"`
	}
	testRule struct {
		// Name of the rule | piped.
		Name string `json:"name"`
	}
	testInline struct {
		// IPs inlined.
		IPs []string `json:"ips"`
	}
	testDuration struct{ D int64 }
)

// The keys of a config type are its fields' JSON names, opened where the
// type is one of the documented packages', each with its doc comment; a
// field without one is an error naming its key.
func TestConfigKeys(t *testing.T) {
	dir := t.TempDir()
	src := `package docgen_test
type testConfig struct {
	// Rules are applied in order.
	Rules []testRule
	// Timeout is how long.
	Timeout *testDuration
	testInline
}
type testRule struct {
	// Name of the rule | piped.
	Name string
}
type testInline struct {
	IPs []string // IPs inlined.
}
`
	if err := os.WriteFile(filepath.Join(dir, "a.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	pkg := reflect.TypeFor[testConfig]().PkgPath()
	docs, err := docgen.ReadFieldDocs(map[string]string{pkg: dir})
	if err != nil {
		t.Fatal(err)
	}
	table, err := docgen.ConfigKeys(reflect.TypeFor[testConfig](), docs, map[reflect.Type]string{reflect.TypeFor[testDuration](): "duration"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| `rules` | list of object | Rules are applied in order. |",
		"| `rules[].name` | string | Name of the rule \\| piped. |",
		"| `timeout` | duration | Timeout is how long. |",
		"| `ips` | list of string | IPs inlined. |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("no %q in\n%s", want, table)
		}
	}
	delete(docs.Fields, pkg+".testRule.Name")
	if _, err := docgen.ConfigKeys(reflect.TypeFor[testConfig](), docs, nil); err == nil || !strings.Contains(err.Error(), "rules[].name") {
		t.Errorf("a field without a doc comment: %v", err)
	}
}
