package requested

import (
	"reflect"
	"testing"
)

// FuzzRequestedDecodersAgree: wherever the scan of the annotation's JSON
// form succeeds, encoding/json's gives the same networks, so the fast
// path changes no annotation's meaning.
func FuzzRequestedDecodersAgree(f *testing.F) {
	for _, s := range []string{
		`[]`, `null`, `[null]`, `[{}]`,
		`[{"name":"ovn","nad":"ovn-attach","defaultRoute":true},{"name":"dp","nad":"dpu/vdpa-net"}]`,
		`[{"name":"a","nad":"ns/x","binding":"sriov","persistentIPs":true,"ips":["10.0.0.5/24"],"mac":"02:00:00:00:00:01","cniArgs":{"a":[1,2]},"logicalSwitch":"s"}]`,
		`[{"name":"a","ips":[],"cniArgs":null}]`,
		`[{"NAME":"a"}]`, `[{"name":"a","name":"b"}]`, `[{"name":"a"}] x`, `[{"name":"a","extra":1}]`,
		"[{\"name\":\"\xff\"}]", `[{"name":1}]`, `[{"defaultRoute":"true"}]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fast, ok := scanRequested(s)
		if !ok {
			return
		}
		slow, msg := requestedV1(s)
		if msg != "" {
			t.Fatalf("the scan decodes %q, encoding/json refuses it: %s", s, msg)
		}
		if !reflect.DeepEqual(fast, slow) {
			t.Fatalf("decoders disagree on %q:\nscan %#v\nv1   %#v", s, fast, slow)
		}
	})
}

// The annotation as users write it takes the fast path.
func TestRequestedFastPath(t *testing.T) {
	if _, ok := scanRequested(`[{"name":"ovn","nad":"ovn-attach","defaultRoute":true},{"name":"dp","nad":"dpu/vdpa-net","ips":["10.0.0.5/24"]}]`); !ok {
		t.Fatal("the scan refused a plain annotation")
	}
}
