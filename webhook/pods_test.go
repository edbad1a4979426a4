package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/webhook"
)

type podStep func(*chain.PodRequest) error

func (podStep) Name() string { return "step" }
func (f podStep) MutatePod(_ context.Context, r *chain.PodRequest) error {
	return f(r)
}

func podReview(op admissionv1.Operation, ns string, obj, old []byte) admission.Request {
	r := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "pod-uid", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Name:     "virt-launcher-a", Namespace: ns, Operation: op, Object: runtime.RawExtension{Raw: obj},
	}}
	if old != nil {
		r.OldObject = runtime.RawExtension{Raw: old}
	}
	return r
}

func TestPodMutator(t *testing.T) {
	cfg := config.Static(exampleConfig(t))
	annotate := podStep(func(r *chain.PodRequest) error {
		if r.Pod.Annotations == nil {
			r.Pod.Annotations = map[string]string{}
		}
		r.Pod.Annotations["x.kubernetes.io/key"] = "v"
		if r.OldPod != nil {
			r.Pod.Annotations["had-old"] = "yes"
		}
		return nil
	})
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"virt-launcher-a","labels":{"kubevirt.io":"virt-launcher"}},"spec":{"containers":[{"name":"compute","image":"x","futureContainerField":1}]}}`)
	h := &webhook.PodMutateHandler{Name: "launcher-pods", Config: cfg, Facts: exampleFacts(t), Mutators: []chain.PodMutator{annotate}}

	resp := h.Handle(context.Background(), podReview(admissionv1.Create, "tenant-a", pod, nil))
	out := applyResponse(t, pod, resp)
	if !resp.Allowed || string(out) == string(pod) {
		t.Fatalf("not patched: %+v", resp.Result)
	}
	for _, o := range resp.Patches {
		if o.Operation == "remove" {
			t.Errorf("pod patch removes %s", o.Path)
		}
	}
	resp = h.Handle(context.Background(), podReview(admissionv1.Update, "tenant-a", pod, pod))
	if out := applyResponse(t, pod, resp); !contains(string(out), `"had-old":"yes"`) {
		t.Errorf("UPDATE did not see the old pod: %s", out)
	}

	for name, c := range map[string]struct {
		h    *webhook.PodMutateHandler
		req  admission.Request
		code int32
	}{
		"malformed pod":     {h, podReview(admissionv1.Create, "tenant-a", []byte(`{"spec":1}`), nil), http.StatusBadRequest},
		"no pod":            {h, podReview(admissionv1.Create, "tenant-a", nil, nil), http.StatusBadRequest},
		"null pod":          {h, podReview(admissionv1.Create, "tenant-a", []byte("null"), nil), http.StatusBadRequest},
		"malformed old pod": {h, podReview(admissionv1.Update, "tenant-a", pod, []byte(`[`)), http.StatusBadRequest},
		"panicking step": {&webhook.PodMutateHandler{Name: "p", Config: cfg, Mutators: []chain.PodMutator{podStep(func(*chain.PodRequest) error { panic("boom") })}},
			podReview(admissionv1.Create, "tenant-a", pod, nil), http.StatusInternalServerError},
		"user error": {&webhook.PodMutateHandler{Name: "p", Config: cfg, Mutators: []chain.PodMutator{podStep(func(*chain.PodRequest) error {
			return chain.RefuseForbidden("the pool is exhausted")
		})}}, podReview(admissionv1.Create, "tenant-a", pod, nil), http.StatusForbidden},
		// kvnet's own reads failing with an API status are kvnet's failure.
		"kvnet's own 403": {&webhook.PodMutateHandler{Name: "p", Config: cfg, Mutators: []chain.PodMutator{podStep(func(*chain.PodRequest) error {
			return fmt.Errorf("reading IPAMClaim: %w", apierrors.NewForbidden(schema.GroupResource{Resource: "ipamclaims"}, "a", nil))
		})}}, podReview(admissionv1.Create, "tenant-a", pod, nil), http.StatusInternalServerError},
	} {
		t.Run(name, func(t *testing.T) {
			resp := c.h.Handle(context.Background(), c.req)
			if resp.Allowed || code(resp) != c.code {
				t.Fatalf("allowed=%v code=%d, want a %d denial", resp.Allowed, code(resp), c.code)
			}
		})
	}
	for name, req := range map[string]admission.Request{
		"excluded namespace": podReview(admissionv1.Create, "kvnet-system", pod, nil),
		"DELETE":             podReview(admissionv1.Delete, "tenant-a", nil, nil),
	} {
		if resp := h.Handle(context.Background(), req); !resp.Allowed || len(resp.Patches) != 0 {
			t.Errorf("%s: allowed=%v patches=%v", name, resp.Allowed, resp.Patches)
		}
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// A pod mutator's additions to the node selector and the containers'
// resources reach the patch as adds of their own keys (or of the member the
// pod lacks), keep everything else of the pod, and only when the mutator
// recorded them: an unrecorded spec change is not looked for.
func TestPodMutatorResourcePatch(t *testing.T) {
	cfg := config.Static(exampleConfig(t))
	add := func(record bool) podStep {
		return func(r *chain.PodRequest) error {
			for i := range r.Pod.Spec.Containers {
				c := &r.Pod.Spec.Containers[i].Resources
				if c.Requests == nil {
					c.Requests = corev1.ResourceList{}
				}
				if c.Limits == nil {
					c.Limits = corev1.ResourceList{}
				}
				c.Requests["intel.com/sriov"], c.Limits["intel.com/sriov"] = resource.MustParse("2"), resource.MustParse("2")
			}
			if r.Pod.Spec.NodeSelector == nil {
				r.Pod.Spec.NodeSelector = map[string]string{}
			}
			r.Pod.Spec.NodeSelector["rack"] = "r1"
			if record {
				r.Record("resources-test", "ns/vf")
			}
			return nil
		}
	}
	for name, c := range map[string]struct {
		pod, want string
		record    bool
	}{
		"no resources, no nodeSelector": {
			pod:    `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"compute","image":"x"},{"name":"side","image":"y","resources":{"limits":{"memory":"1Gi"}}}]}}`,
			want:   `{"metadata":{"annotations":{"kvnet.io/mutations":"[{\"mutator\":\"resources-test\",\"networks\":[\"ns/vf\"]}]"},"name":"p"},"spec":{"containers":[{"image":"x","name":"compute","resources":{"limits":{"intel.com/sriov":"2"},"requests":{"intel.com/sriov":"2"}}},{"image":"y","name":"side","resources":{"limits":{"intel.com/sriov":"2","memory":"1Gi"},"requests":{"intel.com/sriov":"2"}}}],"nodeSelector":{"rack":"r1"}}}`,
			record: true,
		},
		"existing maps get keys": {
			pod:    `{"metadata":{"name":"p","annotations":{}},"spec":{"nodeSelector":{"a":"b"},"containers":[{"name":"compute","image":"x","futureField":1,"resources":{"requests":{"cpu":"100m"},"limits":{"cpu":"1"}}}]}}`,
			want:   `{"metadata":{"annotations":{"kvnet.io/mutations":"[{\"mutator\":\"resources-test\",\"networks\":[\"ns/vf\"]}]"},"name":"p"},"spec":{"containers":[{"futureField":1,"image":"x","name":"compute","resources":{"limits":{"cpu":"1","intel.com/sriov":"2"},"requests":{"cpu":"100m","intel.com/sriov":"2"}}}],"nodeSelector":{"a":"b","rack":"r1"}}}`,
			record: true,
		},
		"unrecorded": {
			pod:  `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"compute","image":"x"}]}}`,
			want: `{"metadata":{"name":"p"},"spec":{"containers":[{"image":"x","name":"compute"}]}}`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := &webhook.PodMutateHandler{Name: "launcher-pods", Config: cfg, Facts: exampleFacts(t), Mutators: []chain.PodMutator{add(c.record)}}
			resp := h.Handle(context.Background(), podReview(admissionv1.Create, "tenant-a", []byte(c.pod), nil))
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			if got := applyResponse(t, []byte(c.pod), resp); !jsonSame(t, got, []byte(c.want)) {
				t.Fatalf("patched pod\n %s\nwant\n %s\n(patch %v)", got, c.want, resp.Patches)
			}
		})
	}
}

func jsonSame(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// A pod that gives twice a member the pod patch relies on (metadata, its
// annotations or labels, spec, the containers and their resources) is
// refused with the member's name, on both pod webhooks and over HTTP, and
// before any pod mutator runs (the migration mutator reserves an address on
// its way): the decode merges both copies, so the patch would address a key
// the last copy, the one a JSON patch applies to, lacks. A duplicate of a
// member the patch does not address is admitted and patched as before.
func TestPodPatchRefusesDuplicateMembers(t *testing.T) {
	cfg := config.Static(exampleConfig(t))
	// change rewrites annotation "a" and adds a resource to every container
	// that has requests, recording it: a replace of a key and an add under
	// a map the decoded pod has.
	ran := 0
	change := podStep(func(r *chain.PodRequest) error {
		ran++
		if _, ok := r.Pod.Annotations["a"]; ok {
			r.Pod.Annotations["a"] = "changed"
		}
		for i := range r.Pod.Spec.Containers {
			if q := r.Pod.Spec.Containers[i].Resources.Requests; q != nil {
				q["intel.com/sriov"] = resource.MustParse("1")
				r.Record("resources-test", "ns/vf")
			}
		}
		return nil
	})
	hs := webhook.NewHandlers(cfg, exampleFacts(t), app.Chains(app.Capabilities{
		PersistentIPs: app.PersistentIPSteps{ClaimRefs: change},
		Migration:     app.MigrationSteps{Addresses: change},
	}))
	for name, c := range map[string]struct {
		pod string
		// dup is the member the 400 names; "" means admitted, with a
		// patch that applies if patched.
		dup     string
		patched bool
	}{
		"annotations twice": {pod: `{"metadata":{"name":"p","annotations":{"a":"1"},"annotations":{"b":"2"}}}`, dup: "metadata.annotations"},
		"metadata twice":    {pod: `{"metadata":{"name":"p","annotations":{"a":"1"}},"metadata":{"name":"p"}}`, dup: "metadata"},
		"resources twice": {pod: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"a"},{"name":"compute","resources":{"requests":{"cpu":"1"}},"resources":{"limits":{}}}]}}`,
			dup: "spec.containers[1].resources"},
		"containers twice": {pod: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"compute","resources":{"requests":{"cpu":"1"}}}],"containers":[{"name":"compute"}]}}`,
			dup: "spec.containers"},
		"name twice, not patched there":       {pod: `{"metadata":{"name":"p","name":"q","annotations":{"a":"1"}}}`, patched: true},
		"annotations twice, nothing to patch": {pod: `{"metadata":{"name":"p","annotations":{"x":"1"},"annotations":{"y":"2"}}}`, dup: "metadata.annotations"},
	} {
		for _, path := range []string{webhook.PathMutateLauncherPods, webhook.PathMutateMigrationPods} {
			t.Run(name+" "+path, func(t *testing.T) {
				ran = 0
				resp := hs[path].Handle(context.Background(), podReview(admissionv1.Create, "tenant-a", []byte(c.pod), nil))
				if c.dup != "" {
					if resp.Allowed || code(resp) != http.StatusBadRequest || !contains(resp.Result.Message, `duplicate field "`+c.dup+`"`) {
						t.Fatalf("allowed=%v %+v (patch %v), want a 400 naming %s", resp.Allowed, resp.Result, resp.Patches, c.dup)
					}
					if ran != 0 {
						t.Fatalf("the pod mutator ran %d times on a pod refused for a duplicate", ran)
					}
					return
				}
				if !resp.Allowed || (len(resp.Patches) > 0) != c.patched {
					t.Fatalf("allowed=%v %+v, patch %v; want admitted, patched=%v", resp.Allowed, resp.Result, resp.Patches, c.patched)
				}
				applyResponse(t, []byte(c.pod), resp)
			})
		}
	}
	// Over HTTP the Edge's one-pass decode refuses the duplicate and the
	// review is decoded again without the view: the handler still sees it.
	body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","namespace":"tenant-a",` +
		`"object":{"metadata":{"name":"p","annotations":{"a":"1"},"annotations":{"b":"2"}}}}}`
	out := post(t, webhook.Webhook(hs[webhook.PathMutateLauncherPods]), "application/json", []byte(body))
	if r := out.Response; r.Allowed || r.Result == nil || r.Result.Code != http.StatusBadRequest || !contains(r.Result.Message, `duplicate field "metadata.annotations"`) {
		t.Fatalf("over HTTP: %+v, patch %s", r.Result, r.Patch)
	}
}
