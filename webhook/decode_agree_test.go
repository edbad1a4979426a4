package webhook

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/apijson/apijsontest"
)

// agreeSeeds are the objects of the golden inputs and examples, the real
// API server's launcher-pod review, each object wrapped in a review, and
// the inputs v2 and v1 treat differently.
func agreeSeeds(t testing.TB) [][]byte {
	t.Helper()
	paths, _ := filepath.Glob("testdata/*.yaml")
	more, _ := filepath.Glob("../examples/*.yaml")
	var out [][]byte
	for _, p := range append(paths, more...) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			if j, err := yaml.YAMLToJSON(doc); err == nil && len(j) > 2 && j[0] == '{' {
				out = append(out, j)
				out = append(out, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","object":`+string(j)+`,"oldObject":null}}`))
			}
		}
	}
	review, err := os.ReadFile("../loadtest/testdata/launcher-pod-review.json")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, review)
	for _, s := range []string{
		`{}`, `null`, `{"metadata":null,"spec":null}`,
		`{"metadata":{"name":"a","name":"b"}}`,
		`{"metadata":{"annotations":{"a":"1","a":"2"}}}`,
		`{"spec":{"template":{"spec":{"networks":[{"name":"x","multus":{"networkName":"n"}}]}},"template":{}}}`,
		`{"metAdata":{"name":"a"},"Spec":{}}`,
		"{\"metadata\":{\"name\":\"\xff\"}}",
		`{"metadata":{"name":"a"}} trailing`,
		`{"spec":{"domain":{"memory":{"guest":"1Gi"},"devices":{"networkInterfaceMultiqueue":true,"interfaces":[{"name":"x","binding":{"name":"vdpa"}}]}}}}`,
		`{"spec":{"nodeName":"n1","affinity":{"nodeAffinity":{}}}}`,
		`{"metadata":{"creationTimestamp":"2026-01-01T00:00:00Z","deletionTimestamp":"2026-01-01T00:00:00Z","ownerReferences":[{"kind":"VirtualMachine","controller":true}]}}`,
		`{"request":{"object":null,"oldObject":{"a":1}}}`,
		`{"request":{"uid":"u","object":{"a":[1,2,{"b":null}]},"userInfo":{"username":"x","extra":{"k":["v"]}},"dryRun":true,"options":{"kind":"CreateOptions"}}}`,
		`{"request":{"object":1e400}}`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// decodeTargets make the review and every view kvnet decodes admitted
// objects into, the review first.
var decodeTargets = []func() any{
	func() any { return &review{Request: &request{}} },
	func() any { return new(vmView) },
	func() any { return new(vmiView) },
	func() any { return new(podView) },
}

// FuzzDecodersAgree holds apijson's fast path to the API server's decoder
// on every type the webhooks decode: wherever v2 decodes an input, the API
// server's decoder gives the same value, and decodeReview borrows exactly
// the bytes v1 copies.
func FuzzDecodersAgree(f *testing.F) {
	for _, s := range agreeSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, target := range decodeTargets {
			if _, err := apijsontest.Agree(raw, target); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := apijsontest.Agree(raw, decodeTargets[0], borrowFrom(raw)); err != nil {
			t.Fatal(err)
		}
	})
}

// The bodies the webhooks see from a real API server take the fast path:
// without it, the benchmarks would measure the fallback.
func TestRealReviewsTakeTheFastPath(t *testing.T) {
	review, err := os.ReadFile("../loadtest/testdata/launcher-pod-review.json")
	if err != nil {
		t.Fatal(err)
	}
	fast, err := apijsontest.Agree(review, decodeTargets[0], borrowFrom(review))
	if err != nil || !fast {
		t.Fatalf("fast=%v err=%v", fast, err)
	}
	rv, err := decodeReview(review)
	if err != nil {
		t.Fatal(err)
	}
	obj := rv.Request.Object
	start := bytes.Index(review, obj)
	if len(obj) == 0 || start < 0 {
		t.Fatalf("object %q is not in the review", obj)
	}
	// Borrowed: the object is a slice of the body, not a copy.
	if &review[start] != &obj[0] {
		t.Fatal("the object was copied, not borrowed")
	}
	for _, target := range decodeTargets[1:] {
		if fast, err := apijsontest.Agree(obj, target); err != nil || !fast {
			t.Fatalf("%T: fast=%v err=%v", target(), fast, err)
		}
	}
}
