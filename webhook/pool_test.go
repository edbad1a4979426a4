package webhook

import (
	"reflect"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
)

// A view and a review go back to their pools empty: the next request that
// takes them sees nothing of the one before. Taken again at once, on the
// same goroutine, the pool hands back the object just returned, so a
// release that left anything behind fails here. (Under the race detector
// the pool drops some objects at random; those come back new and pass.)
func TestPooledViewsComeBackEmpty(t *testing.T) {
	for _, c := range []struct {
		kind chain.Kind
		body string
	}{
		{chain.KindVM, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","operation":"CREATE","namespace":"ns","name":"vm",` +
			`"userInfo":{"username":"alice","groups":["a","b"]},"object":{"metadata":{"name":"vm","namespace":"ns","labels":{"app":"db"},"annotations":{"kvnet.io/networks":"blue"}},` +
			`"spec":{"template":{"metadata":{"labels":{"x":"y"}},"spec":{"networks":[{"name":"default","pod":{}}],"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}}],"networkInterfaceMultiqueue":true},"memory":{"guest":"1Gi"}}}}}}}}`},
		{chain.KindVMI, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","operation":"CREATE","namespace":"ns","name":"vmi",` +
			`"object":{"metadata":{"name":"vmi","namespace":"ns","annotations":{"kvnet.io/networks":"blue"}},"spec":{"domain":{"devices":{}}}}}}`},
	} {
		t.Run(string(c.kind), func(t *testing.T) {
			view := newVMView(c.kind)
			parts := reviewPool.Get().(*reviewParts)
			rv, err := decodeReviewInto(parts, []byte(c.body), view)
			if err != nil || !rv.Request.Object.decoded {
				t.Fatalf("decoded=%v, err=%v", rv != nil && rv.Request.Object.decoded, err)
			}
			req, _, err := decodeVMOrVMI(c.kind, rv.Request.Object.raw, true, view)
			if err != nil {
				t.Fatal(err)
			}
			// What mutators do: append to the spec's lists, which the view
			// backs where the object had none.
			req.Spec.Networks = append(req.Spec.Networks, kubevirtv1.Network{Name: "blue"})
			req.Spec.Domain.Devices.Interfaces = append(req.Spec.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "blue"})
			req.Record("networks", "", "blue")

			releaseVMView(view)
			buffers := answerBuffers{review: parts}
			buffers.release()

			if again := newVMView(c.kind); !reflect.ValueOf(again).Elem().IsZero() {
				t.Errorf("a view came back from its pool holding %+v", again)
			}
			if again := reviewPool.Get().(*reviewParts); !reflect.ValueOf(again).Elem().IsZero() {
				t.Errorf("a review came back from its pool holding %+v", again.review)
			}
		})
	}
}
