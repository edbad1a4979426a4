package netattach

import (
	"encoding/json"
	"strings"
	"testing"
)

// ParseRefIn reads both forms KubeVirt's multus.networkName has, resolving
// the short one in the given namespace, and refuses what is no reference.
func TestParseRefIn(t *testing.T) {
	cases := []struct{ ref, ns, name string }{
		{"br", "def", "br"}, {"other/br", "other", "br"}, {"ns/my.nad", "ns", "my.nad"},
	}
	for _, c := range cases {
		r, err := ParseRefIn(c.ref, "def")
		if err != nil || r.Namespace != c.ns || r.Name != c.name {
			t.Errorf("ParseRefIn(%q) = %+v, %v", c.ref, r, err)
		}
	}
	for _, bad := range []string{"", "a/b/c", "/b", "a/", "Upper", "ns_x/b"} {
		if _, err := ParseRefIn(bad, "def"); err == nil {
			t.Errorf("ParseRefIn(%q) accepted", bad)
		}
	}
}

// A Ref's JSON form is its text; a text that is no reference decodes (so
// that config validation can name its field) to a Ref whose Err says why,
// and the empty text to the zero Ref.
func TestRefJSON(t *testing.T) {
	for in, want := range map[string]string{`"br"`: "br", `"ns/br"`: "ns/br", `"a/b/c"`: "a/b/c", `""`: ""} {
		var r Ref
		if err := json.Unmarshal([]byte(in), &r); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if r.String() != want {
			t.Errorf("%s decodes to %q", in, r.String())
		}
		if out, _ := json.Marshal(r); string(out) != in {
			t.Errorf("%s encodes back as %s", in, out)
		}
		if bad := strings.Count(want, "/") > 1; (r.Err() != nil) != bad || r.IsZero() != (want == "") {
			t.Errorf("%s: Err %v, IsZero %v", in, r.Err(), r.IsZero())
		}
	}
	if r := RefOf("br").In("ns"); r != (Ref{Namespace: "ns", Name: "br"}) || r.String() != "ns/br" {
		t.Errorf("In: %+v", r)
	}
}
