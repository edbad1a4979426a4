package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/webhook"
)

var update = flag.Bool("update", false, "rewrite the *.golden.yaml files from the current output")

// goldenCase is one input file and the golden file its mutation must equal.
type goldenCase struct {
	name, in, golden string
}

// goldenCases are testdata/*.yaml, and the README's examples/vms.yaml whose
// golden the offline CLI test compares against too.
func goldenCases(t testing.TB) []goldenCase {
	t.Helper()
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out := []goldenCase{{name: "examples-vms", in: filepath.Join(examplesDir, "vms.yaml"), golden: "testdata/examples-vms.golden.yaml"}}
	for _, f := range files {
		if strings.HasSuffix(f, ".golden.yaml") {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		out = append(out, goldenCase{name: name, in: f, golden: filepath.Join("testdata", name+".golden.yaml")})
	}
	return out
}

func readDocs(t testing.TB, path string) []offline.Doc {
	t.Helper()
	docs, err := offline.ReadFiles([]string{path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []offline.Doc
	for _, d := range docs {
		if chain.Kind(d.Kind) == chain.KindVM || chain.Kind(d.Kind) == chain.KindVMI {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no VM or VMI", path)
	}
	return out
}

// TestGolden runs each input through the real mutating handler as a CREATE,
// applies the patch, checks that the validating handler admits the result,
// and compares it with the golden file. go test ./webhook -run TestGolden -update
// rewrites the goldens.
func TestGolden(t *testing.T) {
	hs := exampleHandlers(t)
	for _, gc := range goldenCases(t) {
		t.Run(gc.name, func(t *testing.T) {
			var got bytes.Buffer
			for i, d := range readDocs(t, gc.in) {
				resp, mutated := mutate(t, hs, chain.Kind(d.Kind), admissionv1.Create, d.Raw, nil)
				if !resp.Allowed {
					t.Fatalf("%s: mutation refused: %+v", d.Source, resp.Result)
				}
				for _, op := range resp.Patches {
					if op.Operation == "remove" {
						t.Errorf("%s: patch removes %s", d.Source, op.Path)
					}
				}
				vpath := webhook.PathValidateVM
				if chain.Kind(d.Kind) == chain.KindVMI {
					vpath = webhook.PathValidateVMI
				}
				if v := hs[vpath].Handle(context.Background(), review(chain.Kind(d.Kind), admissionv1.Create, "", mutated, nil)); !v.Allowed {
					t.Errorf("%s: the mutated object is refused: %v", d.Source, v.Result)
				}
				y, err := offline.ToYAML(mutated)
				if err != nil {
					t.Fatal(err)
				}
				if i > 0 {
					got.WriteString("---\n")
				}
				got.Write(y)
			}
			if *update {
				if err := os.WriteFile(gc.golden, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(gc.golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("%s differs from %s (run with -update after checking):\n--- got\n%s", gc.in, gc.golden, got.String())
			}
		})
	}
}

// Fields a newer KubeVirt has must survive, whatever the golden says.
func TestUnknownFieldsSurvive(t *testing.T) {
	hs := exampleHandlers(t)
	d := readDocs(t, "testdata/vmi-unknown-fields.yaml")[0]
	resp, mutated := mutate(t, hs, chain.Kind(d.Kind), admissionv1.Create, d.Raw, nil)
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("not mutated: %+v", resp.Result)
	}
	var in, out map[string]any
	_ = json.Unmarshal(d.Raw, &in)
	_ = json.Unmarshal(mutated, &out)
	for _, path := range [][]string{
		{"spec", "someFutureTopLevel"},
		{"spec", "domain", "devices", "someFutureField"},
		{"status", "futureStatus"},
	} {
		if a, b := dig(in, path), dig(out, path); a == nil || !reflect.DeepEqual(a, b) {
			t.Errorf("%s: before %v, after %v", strings.Join(path, "."), a, b)
		}
	}
	spec := out["spec"].(map[string]any)
	iface0 := dig(spec, []string{"domain", "devices", "interfaces"}).([]any)[0].(map[string]any)
	net0 := spec["networks"].([]any)[0].(map[string]any)
	if iface0["futureInterfaceOption"] != "on" || net0["futureNetworkOption"] != float64(7) {
		t.Errorf("unknown fields in list elements lost: %v / %v", iface0, net0)
	}
}

func dig(m map[string]any, path []string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

// Mutating twice equals mutating once: the API server reinvokes webhooks
// (reinvocationPolicy IfNeeded), KubeVirt updates VMs, and users re-apply.
// Over every example, every golden input and every golden output, a second
// pass (as CREATE and as UPDATE of the stored object) patches nothing.
func TestIdempotent(t *testing.T) {
	hs := exampleHandlers(t)
	inputs := []string{filepath.Join(examplesDir, "vms.yaml"), filepath.Join(examplesDir, "invalid.yaml")}
	for _, gc := range goldenCases(t) {
		inputs = append(inputs, gc.in)
		if _, err := os.Stat(gc.golden); err == nil {
			inputs = append(inputs, gc.golden)
		}
	}
	for _, in := range inputs {
		for _, d := range readDocs(t, in) {
			t.Run(d.Source, func(t *testing.T) {
				resp, once := mutate(t, hs, chain.Kind(d.Kind), admissionv1.Create, d.Raw, nil)
				if !resp.Allowed {
					t.Fatalf("first pass refused: %v", resp.Result)
				}
				for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
					var old []byte
					if op == admissionv1.Update {
						old = once
					}
					resp2, twice := mutate(t, hs, chain.Kind(d.Kind), op, once, old)
					if !resp2.Allowed {
						t.Fatalf("%s second pass refused: %v", op, resp2.Result)
					}
					if len(resp2.Patches) != 0 {
						t.Errorf("%s second pass patched: %v", op, resp2.Patches)
					}
					var a, b any
					_ = json.Unmarshal(once, &a)
					_ = json.Unmarshal(twice, &b)
					if !reflect.DeepEqual(a, b) {
						t.Errorf("%s: twice != once:\n once %s\ntwice %s", op, once, twice)
					}
				}
			})
		}
	}
}

// Every example and golden input, mutated and validated through the Edge
// (the review scanned by tokens, the view with it), is answered as the
// handler alone answers it (the view decoded by the API server's
// decoder): the two decodes and the patches built from them (a list read
// whole is replaced whole, another gets an add per element) change the
// object alike, and both kinds of list patch are exercised. The Edge keeps
// what it decodes a request into for the next one, so the inputs are
// served one after another, forwards and then backwards: each follows a
// different one.
func TestEdgeAnswersAsTheHandler(t *testing.T) {
	hs := exampleHandlers(t)
	inputs := []string{filepath.Join(examplesDir, "vms.yaml"), filepath.Join(examplesDir, "invalid.yaml")}
	for _, gc := range goldenCases(t) {
		inputs = append(inputs, gc.in)
	}
	var all []edgeExchange
	for _, in := range inputs {
		for _, d := range readDocs(t, in) {
			for _, path := range vmPaths(chain.Kind(d.Kind)) {
				req := review(chain.Kind(d.Kind), admissionv1.Create, "", d.Raw, nil)
				req.UID = types.UID(fmt.Sprintf("%s-%d", d.Source, len(all)))
				x, err := newEdgeExchange(hs, path, req)
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, x)
			}
		}
	}
	edges := edgesOf(hs)
	var replaced, appended int
	for pass, order := range [][]int{forwards(len(all)), backwards(len(all))} {
		for _, i := range order {
			patch, err := all[i].check(edges)
			if err != nil {
				t.Errorf("pass %d: %v", pass, err)
				continue
			}
			var ops []struct{ Op, Path string }
			if len(patch) > 0 {
				if err := json.Unmarshal(patch, &ops); err != nil {
					t.Fatal(err)
				}
			}
			for _, op := range ops {
				switch {
				case op.Op == "replace" && (strings.HasSuffix(op.Path, "/networks") || strings.HasSuffix(op.Path, "/interfaces")):
					replaced++
				case op.Op == "add" && strings.HasSuffix(op.Path, "/-"):
					appended++
				}
			}
		}
	}
	if replaced == 0 || appended == 0 {
		t.Fatalf("lists replaced whole %d times, appended to %d times: the inputs no longer exercise both", replaced, appended)
	}
	t.Logf("lists replaced whole %d times, appended to %d times", replaced, appended)
}

// vmPaths are the mutating and validating paths of kind.
func vmPaths(kind chain.Kind) []string {
	if kind == chain.KindVMI {
		return []string{webhook.PathMutateVMI, webhook.PathValidateVMI}
	}
	return []string{webhook.PathMutateVM, webhook.PathValidateVM}
}

// edgesOf serves each handler of hs through its own Edge.
func edgesOf(hs webhook.Handlers) map[string]http.Handler {
	edges := map[string]http.Handler{}
	for path, h := range hs {
		edges[path] = webhook.Webhook(h)
	}
	return edges
}

// edgeExchange is one request and the handler's own answer to it, which
// the Edge must give too.
type edgeExchange struct {
	path string
	req  admission.Request
	want admission.Response
}

// newEdgeExchange gives the handler req as controller-runtime's decoder
// would, from the review the Edge is sent (a null object is none). It
// fails for an object that is not JSON, which no review can carry.
func newEdgeExchange(hs webhook.Handlers, path string, req admission.Request) (edgeExchange, error) {
	body, err := json.Marshal(admissionv1.AdmissionReview{Request: &req.AdmissionRequest})
	if err != nil {
		return edgeExchange{}, err
	}
	var decoded admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &decoded); err != nil {
		return edgeExchange{}, err
	}
	req.AdmissionRequest = *decoded.Request
	return edgeExchange{path: path, req: req, want: hs[path].Handle(context.Background(), req)}, nil
}

// check posts x's request to its Edge, compares the answer with the
// handler's and returns the Edge's patch. The patches may differ in form
// (the Edge's decode knows when a list was read whole and may replace
// it), not in what they make of the object.
func (x edgeExchange) check(edges map[string]http.Handler) ([]byte, error) {
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &x.req.AdmissionRequest,
	})
	if err != nil {
		return nil, err
	}
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, x.path, bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	edges[x.path].ServeHTTP(rec, r)
	var got admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Response == nil {
		return nil, fmt.Errorf("%s %s: undecodable answer %s: %v", x.path, x.req.UID, rec.Body.Bytes(), err)
	}
	g, w := got.Response, x.want
	raw := x.req.Object.Raw
	apply := func(p []byte) ([]byte, error) {
		if len(p) == 0 || string(p) == "null" {
			return raw, nil
		}
		patch, err := jsonpatch.DecodePatch(p)
		if err != nil {
			return nil, err
		}
		return patch.Apply(raw)
	}
	gotObj, err := apply(g.Patch)
	if err != nil {
		return nil, fmt.Errorf("%s %s: the Edge's patch %s: %v", x.path, x.req.UID, g.Patch, err)
	}
	wantPatch, err := json.Marshal(w.Patches)
	if err != nil {
		return nil, err
	}
	wantObj, err := apply(wantPatch)
	if err != nil {
		return nil, fmt.Errorf("%s %s: the handler's patch %s: %v", x.path, x.req.UID, wantPatch, err)
	}
	if g.UID != x.req.UID || g.Allowed != w.Allowed || !sameJSON(gotObj, wantObj) || !slices.Equal(g.Warnings, w.Warnings) ||
		(!w.Allowed && (g.Result == nil || w.Result == nil || g.Result.Message != w.Result.Message || g.Result.Code != w.Result.Code)) {
		return nil, fmt.Errorf("%s %s: through the Edge\n allowed=%v object=%s warnings=%q result=%+v\nalone\n allowed=%v object=%s warnings=%q result=%+v",
			x.path, x.req.UID, g.Allowed, gotObj, g.Warnings, g.Result, w.Allowed, wantObj, w.Warnings, w.Result)
	}
	return g.Patch, nil
}

func forwards(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func backwards(n int) []int {
	out := forwards(n)
	slices.Reverse(out)
	return out
}

// sameJSON reports whether a and b are the same JSON value, or the same
// bytes where they are not JSON.
func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(x, y)
}
