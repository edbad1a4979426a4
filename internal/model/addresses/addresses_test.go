package addresses

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestValidate(t *testing.T) {
	for name, c := range map[string]struct {
		r    Request
		want string // "" = valid; else a substring of the only error
	}{
		"dual stack":           {r: Request{IPs: []string{"10.0.0.5/24", "fd00::5/64"}, MAC: "02:00:00:00:00:01", CNIArgs: []byte(`{"a":1}`)}},
		"host route /32":       {r: Request{IPs: []string{"10.0.0.0/32"}}},
		"no prefix":            {r: Request{IPs: []string{"10.0.0.5"}}, want: "x.ips[0]: Invalid value: \"10.0.0.5\": want an IP in CIDR"},
		"network address":      {r: Request{IPs: []string{"10.0.0.0/24"}}, want: "network address"},
		"two IPv4":             {r: Request{IPs: []string{"10.0.0.5/24", "10.0.0.6/24"}}, want: "x.ips[1]"},
		"EUI-64 MAC":           {r: Request{MAC: "02:00:00:00:00:00:00:01"}, want: "48-bit"},
		"multicast MAC":        {r: Request{MAC: "01:00:5e:00:00:01"}, want: "multicast"},
		"cniArgs not object":   {r: Request{CNIArgs: []byte(`[1]`)}, want: "x.cniArgs"},
		"cniArgs null":         {r: Request{CNIArgs: []byte(`null`)}, want: "x.cniArgs"},
		"kube-ovn switch only": {r: Request{LogicalSwitch: "s"}},
	} {
		t.Run(name, func(t *testing.T) {
			errs := c.r.Validate(field.NewPath("x"))
			switch {
			case c.want == "" && len(errs) != 0:
				t.Errorf("errors %v, want none", errs)
			case c.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), c.want)):
				t.Errorf("errors %v, want one with %q", errs, c.want)
			}
		})
	}
}

func TestParseFormat(t *testing.T) {
	m, err := Parse(`{"b":{"mac":"02:00:00:00:00:01"},"a":{"ips":["10.0.0.5/24"],"cniArgs":{"z":1,"y":2}}}`)
	if err != nil {
		t.Fatal(err)
	}
	if got := Format(m); got != `{"a":{"ips":["10.0.0.5/24"],"cniArgs":{"z":1,"y":2}},"b":{"mac":"02:00:00:00:00:01"}}` {
		t.Errorf("Format = %s: want keys sorted, cniArgs as written", got)
	}
	for _, bad := range []string{`{"a":{"ip":["10.0.0.5/24"]}}`, `[]`, `{"a":{}} x`, `{`} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%s) succeeded", bad)
		}
	}
	if Addr("10.0.0.5/24") != "10.0.0.5" || Addr("fd00::5/64") != "fd00::5" {
		t.Error("Addr does not strip the prefix")
	}
}

func TestMayRequest(t *testing.T) {
	for v, want := range map[string]bool{
		`[{"name":"a","nad":"n","ips":["10.0.0.5/24"]}]`: true,
		` [{"name":"a","nad":"n","cniArgs":{}}]`:         true,
		`[{"name":"a","nad":"n","defaultRoute":true}]`:   false,
		`ns/nad@ips`: false, // the short form cannot carry addresses
		``:           false,
	} {
		if got := MayRequest(v); got != want {
			t.Errorf("MayRequest(%s) = %v, want %v", v, got, want)
		}
	}
}

// FuzzParse: any kvnet.io/addresses value parses or errors without a panic,
// and what parses prints back to JSON that parses to the same requests.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `{"a":null}`, `{"a":{}}`, `{"a":{"ip":"x"}}`, `{"a":{"ips":[1]}}`, `{} {}`,
		`{"b":{"mac":"02:00:00:00:00:01"},"a":{"ips":["10.0.0.5/24","fd00::5/64"],"cniArgs":{"z":1},"logicalSwitch":"s"}}`,
		`{"a":{"cniArgs":[1,{"k":null}]},"a":{"mac":"m"}}`, `{"a":{"IPS":["10.0.0.1/8"]}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := Parse(s)
		if err != nil {
			return
		}
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("parsed %q does not print: %v", s, err)
		}
		again, err := Parse(string(b))
		if err != nil {
			t.Fatalf("Parse(print(Parse(%q))) = %v; printed %s", s, err, b)
		}
		if len(again) != len(m) {
			t.Fatalf("%d networks became %d", len(m), len(again))
		}
		for k, r := range m {
			if !r.Equal(again[k]) {
				t.Fatalf("network %q: %+v became %+v", k, r, again[k])
			}
		}
	})
}

// Taken finds an IP or MAC that a second network asks for, whatever the
// case of the MAC, and not a network asking again for its own.
func TestTaken(t *testing.T) {
	var taken Taken
	taken.TakeMAC("02:00:00:00:00:AA", "default")
	steps := []struct {
		network string
		r       Request
		want    string
	}{
		{"blue", Request{IPs: []string{"10.0.0.5/24"}, MAC: "02:00:00:00:00:01"}, "[]"},
		{"blue", Request{IPs: []string{"10.0.0.5/24"}}, "[]"},
		{"red", Request{IPs: []string{"10.0.0.6/24", "10.0.0.5/24"}, MAC: "02:00:00:00:00:aa"}, "[{IP 10.0.0.5 blue} {MAC 02:00:00:00:00:aa default}]"},
		{"green", Request{MAC: "02:00:00:00:00:01"}, "[{MAC 02:00:00:00:00:01 blue}]"},
	}
	for _, s := range steps {
		if got := fmt.Sprint(taken.Take(s.network, s.r)); got != s.want {
			t.Errorf("%s takes %+v: clashes %s, want %s", s.network, s.r, got, s.want)
		}
	}
}
