package requested_test

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/requested"
)

var annoPath = field.NewPath("metadata", "annotations").Key("kvnet.io/networks")

func TestParse(t *testing.T) {
	cases := map[string]struct {
		in   string
		want []config.Network
		errs int
	}{
		"empty":                  {in: "  "},
		"short name":             {in: "br", want: []config.Network{{Name: "br", NAD: netattach.RefOf("br"), Binding: "auto"}}},
		"short ns/name@iface":    {in: "shared/br2@second", want: []config.Network{{Name: "second", NAD: netattach.RefOf("shared/br2"), Binding: "auto"}}},
		"short list with spaces": {in: " a , b/c@d ", want: []config.Network{{Name: "a", NAD: netattach.RefOf("a"), Binding: "auto"}, {Name: "d", NAD: netattach.RefOf("b/c"), Binding: "auto"}}},
		"JSON": {
			in: `[{"name":"a","nad":"ns/x","binding":"sriov","defaultRoute":true},{"name":"b","nad":"y"}]`,
			want: []config.Network{
				{Name: "a", NAD: netattach.RefOf("ns/x"), Binding: "sriov", DefaultRoute: true},
				{Name: "b", NAD: netattach.RefOf("y"), Binding: "auto"},
			},
		},
		"JSON empty list":                 {in: "[]"},
		"short: empty item":               {in: "a,,b", errs: 1},
		"short: empty interface":          {in: "a@", errs: 1},
		"short: empty namespace":          {in: "/a", errs: 1},
		"short: too many slashes":         {in: "a/b/c", errs: 1},
		"short: NAD name is no DNS label": {in: "my.nad", errs: 1},
		"short: upper case":               {in: "Br", errs: 2},
		"short: twice the same name":      {in: "a, ns/a", errs: 1},
		"JSON: not a list of objects":     {in: `["a"]`, errs: 1},
		"JSON: unknown key":               {in: `[{"name":"a","nad":"b","vlan":3}]`, errs: 1},
		"JSON: missing nad":               {in: `[{"name":"a"}]`, errs: 1},
		"JSON: bad binding":               {in: `[{"name":"a","nad":"b","binding":"Bridge!"}]`, errs: 1},
		"JSON: broken":                    {in: `[{"name":"a"`, errs: 1},
		"JSON: trailing garbage":          {in: `[{"name":"a","nad":"b"}] x`, errs: 1},
		"JSON: two lists":                 {in: `[{"name":"a","nad":"b"}][{"name":"c","nad":"d"}]`, errs: 1},
		"JSON: two default routes":        {in: `[{"name":"a","nad":"b","defaultRoute":true},{"name":"c","nad":"d","defaultRoute":true}]`, errs: 1},
		"JSON: null element":              {in: `[null]`, errs: 2},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got, errs := requested.Parse(c.in, requested.AnnotationPath)
			if len(errs) != c.errs {
				t.Fatalf("errors = %v, want %d", errs, c.errs)
			}
			for _, e := range errs {
				if e.Type != field.ErrorTypeInvalid || e.Field != annoPath.String() {
					t.Errorf("error %v: want Invalid on %s", e, annoPath)
				}
			}
			if c.errs == 0 && (len(got) > 0 || len(c.want) > 0) && !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

// FuzzParse: any annotation value gives networks or field errors on
// the annotation, never a panic; accepted networks are valid config networks.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "br", "ns/nad@name, nad2", " a , b/c@d ", "a@", "/a", "a/b/c", "@", ",",
		`[{"name":"a","nad":"ns/x","binding":"sriov","defaultRoute":true}]`,
		`[{"name":"a"}]`, `[null]`, `[`, `[]`, `[{"name":1}]`, `{"name":"a"}`, "\x00", "a\u00e9",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		nets, errs := requested.Parse(s, requested.AnnotationPath)
		if len(errs) > 0 {
			if nets != nil {
				t.Fatalf("networks %v returned with errors %v", nets, errs)
			}
			for _, e := range errs {
				if e.Field != annoPath.String() {
					t.Fatalf("error on %s, want %s", e.Field, annoPath)
				}
			}
			return
		}
		seen := map[string]bool{}
		for i, n := range nets {
			if es := config.ValidateNetwork(n, field.NewPath("n").Index(i)); len(es) > 0 {
				t.Fatalf("accepted an invalid network %+v: %v", n, es)
			}
			if seen[n.Name] {
				t.Fatalf("accepted %q twice", n.Name)
			}
			seen[n.Name] = true
			if strings.TrimSpace(n.Binding) == "" {
				t.Fatalf("binding not defaulted: %+v", n)
			}
		}
	})
}
