package webhook

import (
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/apijson"
)

// What jsonstacks_test.go sets side by side: each of the Edge's JSON
// stacks, and the one it stands in for.

// DecodeReview is the Edge's decode: the review, and the handler's view of
// its object in the same pass (scanned by tokens, see scanReview).
func DecodeReview(body []byte, view any) error {
	_, err := decodeReview(body, view)
	return err
}

// DecodeReviewV1 is the same decode by the API server's decoder alone: the
// review, then the view from the object's bytes.
func DecodeReviewV1(body []byte, view any) error {
	rv := &review{Request: &request{}}
	if err := apijson.V1(body, rv); err != nil {
		return err
	}
	rv.complete()
	return apijson.V1(rv.Request.Object.raw, view)
}

// NewView is the view h decodes its object into.
func NewView(h admission.Handler) any { return h.(viewHandler).newView() }

// EncodeAnswer encodes resp's patch, then the AdmissionReview that answers
// with it, with m, as Edge.handle and Edge.write do with encoding/json.
func EncodeAnswer(resp admission.Response, m func(any) ([]byte, error)) ([]byte, error) {
	ops := make([]patchOp, len(resp.Patches))
	for i, op := range resp.Patches {
		ops[i] = patchOp{Op: op.Operation, Path: op.Path, Value: op.Value}
	}
	p, err := m(ops)
	if err != nil {
		return nil, err
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType, resp.Patches = p, &pt, nil
	out := admissionv1.AdmissionReview{Response: &resp.AdmissionResponse}
	out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	return m(out)
}

// WatchingBodies reports whether e's body watcher is running.
func (e *Edge) WatchingBodies() bool {
	e.bodies.mu.Lock()
	defer e.bodies.mu.Unlock()
	return e.bodies.watching
}

// BodyWatchers reports how many body watchers e has started.
func (e *Edge) BodyWatchers() int {
	e.bodies.mu.Lock()
	defer e.bodies.mu.Unlock()
	return e.bodies.starts
}
