package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/config"
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
	h := &webhook.PodMutator{Name: "launcher-pods", Config: cfg, Facts: exampleFacts(t), Mutators: []chain.PodMutator{annotate}}

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
		h    *webhook.PodMutator
		req  admission.Request
		code int32
	}{
		"malformed pod":     {h, podReview(admissionv1.Create, "tenant-a", []byte(`{"spec":1}`), nil), http.StatusBadRequest},
		"no pod":            {h, podReview(admissionv1.Create, "tenant-a", nil, nil), http.StatusBadRequest},
		"null pod":          {h, podReview(admissionv1.Create, "tenant-a", []byte("null"), nil), http.StatusBadRequest},
		"malformed old pod": {h, podReview(admissionv1.Update, "tenant-a", pod, []byte(`[`)), http.StatusBadRequest},
		"panicking step": {&webhook.PodMutator{Name: "p", Config: cfg, Mutators: []chain.PodMutator{podStep(func(*chain.PodRequest) error { panic("boom") })}},
			podReview(admissionv1.Create, "tenant-a", pod, nil), http.StatusInternalServerError},
		"user error": {&webhook.PodMutator{Name: "p", Config: cfg, Mutators: []chain.PodMutator{podStep(func(*chain.PodRequest) error {
			return chain.RefuseForbidden("the pool is exhausted")
		})}}, podReview(admissionv1.Create, "tenant-a", pod, nil), http.StatusForbidden},
		// kvnet's own reads failing with an API status are kvnet's failure.
		"kvnet's own 403": {&webhook.PodMutator{Name: "p", Config: cfg, Mutators: []chain.PodMutator{podStep(func(*chain.PodRequest) error {
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
