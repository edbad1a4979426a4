package webhook_test

import (
	"context"
	"net/http"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/webhook"
)

// A review without a request, or whose request has no uid, cannot be
// answered (the API server matches the answer by uid): it is a 400, not an
// "allowed" with an empty uid.
func TestEdgeRefusesReviewWithoutRequestUID(t *testing.T) {
	h := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") }))
	for body, want := range map[string]int32{
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":null}`:              http.StatusBadRequest,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`:                             http.StatusBadRequest,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":""}}`:        http.StatusBadRequest,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1"}}`:     http.StatusOK,
		`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"u2"}}`: http.StatusOK,
	} {
		out := post(t, h, "application/json", []byte(body))
		got := int32(http.StatusOK)
		if out.Response.Result != nil && out.Response.Result.Code != 0 {
			got = out.Response.Result.Code
		}
		if got != want || (want == http.StatusOK && !out.Response.Allowed) {
			t.Errorf("%s: answered %d (allowed %v, uid %q), want %d", body, got, out.Response.Allowed, out.Response.UID, want)
		}
	}
}
