package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/webhook"
)

// fuzzSeeds are every example and golden input as JSON, plus broken bytes.
func fuzzSeeds(f *testing.F) [][]byte {
	f.Helper()
	paths := []string{filepath.Join(examplesDir, "vms.yaml"), filepath.Join(examplesDir, "invalid.yaml")}
	more, _ := filepath.Glob("testdata/*.yaml")
	paths = append(paths, more...)
	docs, err := offline.ReadFiles(paths, nil)
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, d := range docs {
		out = append(out, d.Raw)
	}
	for _, s := range []string{
		``, `{`, `null`, `[]`, `{}`, `{"spec":null}`, `{"spec":{"template":null}}`,
		`{"metadata":{"annotations":{"kvnet.io/networks":"a/b/c"}}}`,
		`{"metadata":{"annotations":{"kvnet.io/networks":"[{\"name\":\"x\",\"nad\":\"storage\"}]"}}}`,
		`{"metadata":{"namespace":"tenant-a","annotations":null},"spec":{"template":{"metadata":null,"spec":{"networks":[{"name":"x","multus":{"networkName":"Bad/Ref/x"}}]}}}}`,
		`{"spec":{"domain":{"devices":{"interfaces":[{"name":"a","binding":null}]}},"networks":[{"name":"a","multus":null}]}}`,
		`{"spec":{"networks":[{"name":"dp","multus":{"networkName":"dpu/vdpa-net"}}],"domain":{"memory":{"reservedOverhead":null}}}}`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// FuzzVMHandlers feeds arbitrary object bytes to every VM/VMI handler, as
// CREATE and UPDATE. None may panic or answer 500 (facts come from a
// snapshot, so kvnet itself cannot fail), and every patch must apply to the
// object it was computed for without removing anything.
func FuzzVMHandlers(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	hs := exampleHandlers(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, kind := range []chain.Kind{chain.KindVM, chain.KindVMI} {
			mpath, vpath := webhook.PathMutateVM, webhook.PathValidateVM
			if kind == chain.KindVMI {
				mpath, vpath = webhook.PathMutateVMI, webhook.PathValidateVMI
			}
			for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
				var old []byte
				if op == admissionv1.Update {
					old = raw
				}
				req := review(kind, op, "tenant-a", raw, old)
				resp := hs[mpath].Handle(context.Background(), req)
				if code(resp) >= 500 {
					t.Fatalf("%s %s: %d %s", mpath, op, code(resp), resp.Result.Message)
				}
				if resp.Allowed && len(resp.Patches) > 0 {
					for _, o := range resp.Patches {
						if o.Operation == "remove" {
							t.Fatalf("%s: patch removes %s", mpath, o.Path)
						}
					}
					applyResponse(t, raw, resp)
				}
				if v := hs[vpath].Handle(context.Background(), req); code(v) >= 500 {
					t.Fatalf("%s %s: %d %s", vpath, op, code(v), v.Result.Message)
				}
			}
		}
	})
}

// FuzzAdmissionReview posts arbitrary bodies to every handler (VM and VMI
// mutate and validate, launcher and migration pods, VMIMs) as the webhook server
// mounts them. The server always answers with an AdmissionReview;
// an undecodable review is a 400, never a 500.
func FuzzAdmissionReview(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		rq := review(chain.KindVM, admissionv1.Create, "tenant-a", nil, nil).AdmissionRequest
		ar := admissionv1.AdmissionReview{Request: &rq}
		ar.APIVersion, ar.Kind = "admission.k8s.io/v1", "AdmissionReview"
		if json.Valid(s) {
			ar.Request.Object.Raw = s
		}
		b, _ := json.Marshal(ar)
		f.Add(b)
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"x","operation":"CREATE","object":"x"}}`))
	f.Add([]byte(`not json`))
	for _, s := range []string{
		`{"metadata":{"name":"m","namespace":"tenant-a"},"spec":{"vmiName":"vm","receive":{"migrationID":"mig"}}}`,
		`{"metadata":{"name":"m"},"spec":{"vmiName":"vm","sendTo":{"migrationID":"mig","connectURL":"x:9185"},"receive":{"migrationID":7}}}`,
	} {
		rq := review(chain.KindVMIM, admissionv1.Create, "tenant-a", []byte(s), nil).AdmissionRequest
		ar := admissionv1.AdmissionReview{Request: &rq}
		ar.APIVersion, ar.Kind = "admission.k8s.io/v1", "AdmissionReview"
		b, _ := json.Marshal(ar)
		f.Add(b)
	}
	for _, s := range podSeeds() {
		rq := podReview(admissionv1.Update, "tenant-a", nil, nil).AdmissionRequest
		ar := admissionv1.AdmissionReview{Request: &rq}
		ar.APIVersion, ar.Kind = "admission.k8s.io/v1", "AdmissionReview"
		if json.Valid([]byte(s)) {
			ar.Request.Object.Raw, ar.Request.OldObject.Raw = []byte(s), []byte(s)
		}
		b, _ := json.Marshal(ar)
		f.Add(b)
	}
	srv := map[string]http.Handler{}
	for p, h := range exampleHandlers(f) {
		srv[p] = webhook.Webhook(h)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for p, wh := range srv {
			r := httptest.NewRequest(http.MethodPost, p, bytes.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			wh.ServeHTTP(w, r)
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
				t.Fatalf("%s: response is not an AdmissionReview: %v %s", p, err, w.Body.String())
			}
			if res := out.Response.Result; res != nil && res.Code >= 500 {
				t.Fatalf("%s: %d %s", p, res.Code, res.Message)
			}
		}
	})
}

// FuzzMutateIdempotent checks the two properties that make kvnet's output
// stable under the API server's own re-admission (KubeVirt's controllers
// update VMs they read back, and reinvocationPolicy: IfNeeded runs the
// mutator again on its own output), for VMs and VMIs on CREATE:
//
//   - idempotence: with y the object after the first run's patch, a second
//     run on y is allowed and yields no patch;
//   - kvnet does not refuse its own output: if y validates, the stored y
//     sent back unchanged as an UPDATE (old = new = y) is mutated to nothing
//     and validated too.
//
// "If x validates, so does y" is not a property: the validators do not read
// kvnet.io/networks, so a request for a NAD the namespace lacks validates
// as x and is refused, rightly, once the mutator has added it to y.
func FuzzMutateIdempotent(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	hs := exampleHandlers(f)
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, kind := range []chain.Kind{chain.KindVM, chain.KindVMI} {
			mpath, vpath := webhook.PathMutateVM, webhook.PathValidateVM
			if kind == chain.KindVMI {
				mpath, vpath = webhook.PathMutateVMI, webhook.PathValidateVMI
			}
			first := hs[mpath].Handle(ctx, review(kind, admissionv1.Create, "tenant-a", raw, nil))
			if !first.Allowed {
				continue
			}
			y := applyResponse(t, raw, first)
			second := hs[mpath].Handle(ctx, review(kind, admissionv1.Create, "tenant-a", y, nil))
			if !second.Allowed || len(second.Patches) > 0 {
				t.Fatalf("%s: second run on its own output: allowed=%v %s, patch %v\nfirst patch %v\noutput %s",
					kind, second.Allowed, message(second), second.Patches, first.Patches, y)
			}
			if v := hs[vpath].Handle(ctx, review(kind, admissionv1.Create, "tenant-a", y, nil)); !v.Allowed {
				continue
			}
			upd := review(kind, admissionv1.Update, "tenant-a", y, y)
			if m := hs[mpath].Handle(ctx, upd); !m.Allowed || len(m.Patches) > 0 {
				t.Fatalf("%s: UPDATE of its own admitted output: allowed=%v %s, patch %v\noutput %s", kind, m.Allowed, message(m), m.Patches, y)
			}
			if v := hs[vpath].Handle(ctx, upd); !v.Allowed {
				t.Fatalf("%s: UPDATE of its own admitted output refused: %s\noutput %s", kind, message(v), y)
			}
		}
	})
}

func message(r admission.Response) string {
	if r.Result == nil {
		return ""
	}
	return r.Result.Message
}

// podSeeds are launcher-pod shaped objects: Multus selections with and
// without kvnet's address requests and kube-ovn attachments, and broken
// metadata.
func podSeeds() []string {
	return []string{
		``, `{`, `null`, `[]`, `{}`, `{"metadata":null}`, `{"metadata":{"annotations":null,"labels":null}}`,
		`{"metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"ovn-attach"}}}`,
		`{"metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"[{\"name\":\"ovn-attach\",\"namespace\":\"tenant-a\",\"interface\":\"pod3a7f1c4\"}]"}}}`,
		`{"metadata":{"namespace":"tenant-a","labels":{"kubevirt.io":"virt-launcher"},"annotations":{"kvnet.io/addresses":"{\"blue\":{\"ips\":[\"10.0.0.5/24\"],\"mac\":\"02:00:00:00:00:01\"}}","k8s.v1.cni.cncf.io/networks":"[{\"name\":\"storage\",\"interface\":\"pod16477688c0e\"}]"}},"spec":{"nodeName":"n1","containers":[{"name":"compute"}]}}`,
		`{"metadata":{"annotations":{"kvnet.io/addresses":"not json","k8s.v1.cni.cncf.io/networks":"[{\"name\":1}]"}}}`,
		`{"metadata":{"annotations":{"kvnet.io/skip":"true","k8s.v1.cni.cncf.io/networks":"a/b/c"}}}`,
		`{"metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"tenant-a/ovn-attach@eth1, other/ovn-attach"}},"spec":{"affinity":{"nodeAffinity":null}}}`,
		// Keys match case-sensitively, as in the API server: a patch computed
		// from "Metadata" read as metadata would not apply.
		`{"Metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"ovn-attach"}}}`,
		// A member the patch addresses, twice: the decode merges the
		// copies, a JSON patch sees the last, so the pod is a 400.
		`{"metadata":{"annotations":{"k8s.v1.cni.cncf.io/networks":"ovn-attach"},"annotations":{"a":"b"}}}`,
	}
}

// FuzzLauncherPods feeds arbitrary pod bytes to the launcher-pods webhook
// (kube-ovn's legacy live migration on, so both pod mutators have work), as
// CREATE and UPDATE. It never answers 500 (facts come from a snapshot), the
// patch applies, and a second run on the patched pod yields no patch.
func FuzzLauncherPods(f *testing.F) {
	for _, s := range podSeeds() {
		f.Add([]byte(s))
	}
	cfg := exampleConfig(f)
	cfg.KubeOVN.LegacyLiveMigration = true
	h := webhook.NewHandlers(config.Static(cfg), exampleFacts(f), app.Chains(app.Capabilities{}))[webhook.PathMutateLauncherPods]
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, op := range []admissionv1.Operation{admissionv1.Create, admissionv1.Update} {
			var old []byte
			if op == admissionv1.Update {
				old = raw
			}
			resp := h.Handle(ctx, podReview(op, "tenant-a", raw, old))
			if code(resp) >= 500 {
				t.Fatalf("%s: %d %s", op, code(resp), message(resp))
			}
			if !resp.Allowed {
				continue
			}
			y := applyResponse(t, raw, resp)
			if op == admissionv1.Update {
				old = y
			}
			again := h.Handle(ctx, podReview(op, "tenant-a", y, old))
			if !again.Allowed || len(again.Patches) > 0 {
				t.Fatalf("%s: second run on its own output: allowed=%v %s, patch %v\nfirst patch %v\noutput %s", op, again.Allowed, message(again), again.Patches, resp.Patches, y)
			}
		}
	})
}

// FuzzEdgeAnswersAsHandle serves any object, as a VM and as a VMI, through
// the Edge right after an example VM of the same kind and right before
// it: the Edge, which keeps what it decodes a request into for the next
// one, answers each as the handler does alone.
func FuzzEdgeAnswersAsHandle(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	hs := exampleHandlers(f)
	edges := edgesOf(hs)
	examples := readDocs(f, filepath.Join(examplesDir, "vms.yaml"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // no review can carry it (FuzzAdmissionReview sends such bodies)
		}
		for i, kind := range []chain.Kind{chain.KindVM, chain.KindVMI} {
			example := examples[i%len(examples)].Raw
			for _, path := range vmPaths(kind) {
				for _, obj := range [][]byte{example, raw, example} {
					x, err := newEdgeExchange(hs, path, review(kind, admissionv1.Create, "tenant-a", obj, nil))
					if err != nil {
						t.Fatal(err)
					}
					if _, err := x.check(edges); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
	})
}
