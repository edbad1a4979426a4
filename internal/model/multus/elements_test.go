package multus

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestParseShortForm(t *testing.T) {
	cases := map[string]struct {
		in   string
		want string // Format of the result
		err  bool
	}{
		"name":               {in: "br", want: `[{"name":"br"}]`},
		"ns/name@if, name":   {in: " ns/br@net1 , vf", want: `[{"name":"br","namespace":"ns","interface":"net1"},{"name":"vf"}]`},
		"empty":              {in: "  ", want: `[]`},
		"empty item":         {in: "a,,b", err: true},
		"empty interface":    {in: "a@", err: true},
		"empty namespace":    {in: "/a", err: true},
		"two slashes":        {in: "a/b/c", err: true},
		"space inside":       {in: "a b", err: true},
		"no name before @":   {in: "ns/@x", err: true},
		"JSON list":          {in: `[{"name":"a","namespace":"b","x.io/custom":{"k":[1]},"ips":["10.0.0.1/24"]}]`, want: `[{"name":"a","namespace":"b","x.io/custom":{"k":[1]},"ips":["10.0.0.1/24"]}]`},
		"JSON not a list":    {in: `{"name":"a"}`, err: true},
		"JSON null element":  {in: `[null]`, err: true},
		"JSON name missing":  {in: `[{"namespace":"a"}]`, err: true},
		"JSON name a number": {in: `[{"name":1}]`, err: true},
		"JSON duplicate key": {in: `[{"name":"a","name":"b"}]`, err: true},
		"JSON ips and claim": {in: `[{"name":"a","ips":["10.0.0.1/24"],"ipam-claim-reference":"c"}]`, err: true},
		"JSON broken":        {in: `[{"name":"a"`, err: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			elems, err := Parse(c.in)
			if c.err {
				if err == nil {
					t.Fatalf("accepted: %v", elems)
				}
				if !strings.Contains(err.Error(), NetworksAnnotation) {
					t.Errorf("error %q does not name the annotation", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := Format(elems)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("Format = %s, want %s", got, c.want)
			}
		})
	}
}

// Unknown keys, their order and their raw values survive a change kvnet
// makes to one key; the upstream struct would drop them.
func TestElementKeepsUnknownKeys(t *testing.T) {
	in := `[{"name":"a","x.io/first":1,"namespace":"ns","cni-args":{"nested":{"deep":[true,null]}},"x.io/last":"z"}]`
	elems, err := Parse(in)
	if err != nil {
		t.Fatal(err)
	}
	e := elems[0]
	if !e.Refers("other", "ns", "a") || e.Refers("ns", "other", "a") {
		t.Error("Refers is wrong")
	}
	if err := e.Set(KeyIPAMClaimReference, "vm1.a"); err != nil {
		t.Fatal(err)
	}
	e.SetString(KeyNamespace, "ns2") // keeps its position
	e.Delete("x.io/first")
	e.Delete("not-there")
	got, _ := Format(elems)
	want := `[{"name":"a","namespace":"ns2","cni-args":{"nested":{"deep":[true,null]}},"x.io/last":"z","ipam-claim-reference":"vm1.a"}]`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if !reflect.DeepEqual(e.Keys(), []string{"name", "namespace", "cni-args", "x.io/last", "ipam-claim-reference"}) {
		t.Errorf("keys = %v", e.Keys())
	}
	if e.String("cni-args") != "" || e.Interface() != "" || !e.Has("x.io/last") || string(e.Raw("x.io/last")) != `"z"` {
		t.Error("accessors are wrong")
	}
	var bad Element
	if err := json.Unmarshal([]byte(`[1]`), &bad); err == nil {
		t.Error("an array decoded as an element")
	}
}

func TestNewElement(t *testing.T) {
	got, _ := Format([]*Element{NewElement("", "a"), NewElement("ns", "b")})
	if want := `[{"name":"a"},{"name":"b","namespace":"ns"}]`; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
	if got, _ := Format(nil); got != "[]" {
		t.Fatalf("Format(nil) = %s", got)
	}
}

// FuzzParse: any annotation parses or errors without panicking, and a
// parsed annotation survives Format and Parse again with every key, in
// order, with the same values.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "br", "ns/br@net1, vf", "a,,b", "a@", "/a", "a/b/c", "@", ",", " ",
		`[{"name":"a","namespace":"b","x.io/custom":{"k":[1]},"ips":["10.0.0.1/24"]}]`,
		`[{"name":"a","default-route":["10.0.0.1"],"mac":"02:00:00:00:00:01","interface":"net1"}]`,
		`[{"name":"a","name":"b"}]`, `[null]`, `[{"name":1}]`, `{"name":"a"}`, `[`, `[]`, `[{}]`,
		`[{"name":"a","\u00e9":"\ud800"}]`, "[{\"name\":\"a\",\"k\":\"\xff\"}]",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		first, err := Parse(s)
		if err != nil {
			return
		}
		text, err := Format(first)
		if err != nil {
			t.Fatalf("Format of a parsed annotation: %v", err)
		}
		second, err := Parse(text)
		if err != nil {
			t.Fatalf("Parse(Format(Parse(%q))) = %v; Format gave %s", s, err, text)
		}
		if len(second) != len(first) {
			t.Fatalf("%d elements became %d", len(first), len(second))
		}
		for i := range first {
			a, b := first[i], second[i]
			if !reflect.DeepEqual(a.Keys(), b.Keys()) {
				t.Fatalf("element %d keys %q became %q", i, a.Keys(), b.Keys())
			}
			for _, k := range a.Keys() {
				var va, vb any
				if json.Unmarshal(a.Raw(k), &va) != nil || json.Unmarshal(b.Raw(k), &vb) != nil || !reflect.DeepEqual(va, vb) {
					t.Fatalf("element %d key %q: %s became %s", i, k, a.Raw(k), b.Raw(k))
				}
			}
		}
		again, _ := Format(second)
		if again != text {
			t.Fatalf("Format is not stable: %s then %s", text, again)
		}
	})
}

// An element kvnet did not change prints back as the same bytes (for compact
// input): no HTML escaping of "&", "<", ">" in values.
func TestFormatKeepsBytes(t *testing.T) {
	for _, in := range []string{
		`[{"name":"a","interface":"&0<1>","x.io/k":"<b>","cni-args":{"q":"a&b"}}]`,
		`[{"name":"a","x.io/u":"\u2028é"}]`,
	} {
		elems, err := Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := Format(elems); got != in {
			t.Errorf("Format(Parse(%s)) = %s", in, got)
		}
	}
}

// The default-network element may carry ips with a claim reference (OVN-K
// reads both for a primary UDN); a secondary element may not.
func TestParseDefaultNetwork(t *testing.T) {
	both := `[{"name":"default","namespace":"ovn-kubernetes","ips":["10.0.0.5/24"],"ipam-claim-reference":"vm.default"}]`
	if _, err := Parse(both); err == nil {
		t.Error("Parse accepted ips with ipam-claim-reference")
	}
	elems, err := ParseDefaultNetwork(both)
	if err != nil || len(elems) != 1 || elems[0].String(KeyIPAMClaimReference) != "vm.default" {
		t.Fatalf("ParseDefaultNetwork = %v, %v", elems, err)
	}
	if elems, err := ParseDefaultNetwork("ovn-kubernetes/default"); err != nil || len(elems) != 1 || !elems[0].Refers("x", "ovn-kubernetes", "default") {
		t.Errorf("short form = %v, %v", elems, err)
	}
	if _, err := ParseDefaultNetwork(`[{"name":`); err == nil || !strings.Contains(err.Error(), DefaultNetworkAnnotation) {
		t.Errorf("error %v does not name %s", err, DefaultNetworkAnnotation)
	}
}
