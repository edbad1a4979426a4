package peerwebhook_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/kvnet/kvnet/internal/peerwebhook"
)

// webhook serves reviews over TLS as answer says, and registers itself by
// URL with its CA bundle.
func webhook(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview)) *admissionregv1.MutatingWebhook {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		body, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &review) != nil {
			http.Error(w, "not an AdmissionReview POST", http.StatusBadRequest)
			return
		}
		answer(w, r, &review)
	}))
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return &admissionregv1.MutatingWebhook{
		Name:         "mutatevirtualmachines.peer.example",
		ClientConfig: admissionregv1.WebhookClientConfig{URL: ptr.To(srv.URL + "/mutate"), CABundle: ca},
	}
}

func echo(w http.ResponseWriter, _ *http.Request, review *admissionv1.AdmissionReview) {
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true, Patch: review.Request.Object.Raw}
	review.Request = nil
	_ = json.NewEncoder(w).Encode(review)
}

func request() *admissionv1.AdmissionRequest {
	return &admissionv1.AdmissionRequest{UID: "uid-1", Name: "web", Namespace: "tenant", Operation: admissionv1.Create,
		Object: runtime.RawExtension{Raw: []byte(`{"kind":"VirtualMachine"}`)}}
}

// The review reaches the webhook as the API server sends one, over TLS
// trusting the registered CA bundle, and its answer comes back; the
// connection is kept for the next call.
func TestCallReachesTheWebhook(t *testing.T) {
	hook := webhook(t, echo)
	var c peerwebhook.Client
	for range 2 {
		resp, err := c.Call(context.Background(), hook, request())
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Allowed || resp.UID != "uid-1" || string(resp.Patch) != `{"kind":"VirtualMachine"}` {
			t.Fatalf("answer %+v", resp)
		}
	}
}

// Every way a call can fail is an error naming the webhook and what went
// wrong, never an answer.
func TestCallFailures(t *testing.T) {
	for name, c := range map[string]struct {
		answer func(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview)
		hook   func(*admissionregv1.MutatingWebhook)
		want   string
	}{
		"a serving certificate the CA bundle does not vouch for": {answer: echo,
			hook: func(h *admissionregv1.MutatingWebhook) { h.ClientConfig.CABundle = nil }, want: "certificate"},
		"a CA bundle with no certificate": {answer: echo,
			hook: func(h *admissionregv1.MutatingWebhook) { h.ClientConfig.CABundle = []byte("junk") }, want: "caBundle holds no PEM certificate"},
		"a plain-HTTP URL": {answer: echo,
			hook: func(h *admissionregv1.MutatingWebhook) {
				h.ClientConfig.URL = ptr.To(strings.Replace(*h.ClientConfig.URL, "https:", "http:", 1))
			}, want: "want an https URL"},
		"another request's UID": {answer: func(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview) {
			review.Request.UID = "uid-2"
			echo(w, r, review)
		}, want: `uid "uid-2" to request "uid-1"`},
		"no response": {answer: func(w http.ResponseWriter, _ *http.Request, review *admissionv1.AdmissionReview) {
			review.Request = nil
			_ = json.NewEncoder(w).Encode(review)
		}, want: "has no response"},
		"an HTTP error": {answer: func(w http.ResponseWriter, _ *http.Request, _ *admissionv1.AdmissionReview) {
			http.Error(w, "pool exhausted", http.StatusServiceUnavailable)
		}, want: "HTTP 503: pool exhausted"},
		"not JSON": {answer: func(w http.ResponseWriter, _ *http.Request, _ *admissionv1.AdmissionReview) {
			_, _ = w.Write([]byte("<html>"))
		}, want: "decoding the AdmissionReview"},
		"another kind": {answer: func(w http.ResponseWriter, r *http.Request, review *admissionv1.AdmissionReview) {
			review.Kind = "Status"
			echo(w, r, review)
		}, want: "it answered admission.k8s.io/v1 Status"},
		"an answer past the bound": {answer: func(w http.ResponseWriter, _ *http.Request, _ *admissionv1.AdmissionReview) {
			_, _ = w.Write([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"uid-1","patch":"` + strings.Repeat("A", 4<<20) + `"}}`))
		}, want: "larger than"},
		"a webhook slower than its timeout": {answer: func(_ http.ResponseWriter, r *http.Request, _ *admissionv1.AdmissionReview) {
			<-r.Context().Done() // until kvnet gives up and hangs up
		}, hook: func(h *admissionregv1.MutatingWebhook) { h.TimeoutSeconds = ptr.To[int32](1) }, want: "deadline exceeded"},
	} {
		t.Run(name, func(t *testing.T) {
			hook := webhook(t, c.answer)
			if c.hook != nil {
				c.hook(hook)
			}
			var cl peerwebhook.Client
			resp, err := cl.Call(context.Background(), hook, request())
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), hook.Name) {
				t.Fatalf("Call = %+v, %v; want an error naming %s and %q", resp, err, hook.Name, c.want)
			}
		})
	}
}

// A call waits the webhook's timeoutSeconds, the API server's default
// without one, and never more than the client's cap.
func TestTimeout(t *testing.T) {
	for _, c := range []struct {
		seconds *int32
		cap     time.Duration
		want    time.Duration
	}{
		{nil, 0, peerwebhook.DefaultTimeout},
		{ptr.To[int32](3), 0, 3 * time.Second},
		{ptr.To[int32](30), 5 * time.Second, 5 * time.Second},
		{nil, 5 * time.Second, 5 * time.Second},
		{ptr.To[int32](2), 5 * time.Second, 2 * time.Second},
	} {
		cl := peerwebhook.Client{MaxTimeout: c.cap}
		if got := cl.Timeout(&admissionregv1.MutatingWebhook{TimeoutSeconds: c.seconds}); got != c.want {
			t.Errorf("timeoutSeconds %v, cap %v: %v, want %v", ptr.Deref(c.seconds, -1), c.cap, got, c.want)
		}
	}
}

// A Service is reached as <name>.<namespace>.svc, on 443 and at "/"
// unless it says otherwise, the certificate checked for that name.
func TestAddress(t *testing.T) {
	for name, c := range map[string]struct {
		cc               admissionregv1.WebhookClientConfig
		address, server  string
		wantErrSubstring string
	}{
		"a Service, as shipped": {cc: admissionregv1.WebhookClientConfig{Service: &admissionregv1.ServiceReference{Name: "kubemacpool-service", Namespace: "kubemacpool-system", Path: ptr.To("/mutate-virtualmachines")}},
			address: "https://kubemacpool-service.kubemacpool-system.svc:443/mutate-virtualmachines", server: "kubemacpool-service.kubemacpool-system.svc"},
		"a Service on its own port, no path": {cc: admissionregv1.WebhookClientConfig{Service: &admissionregv1.ServiceReference{Name: "p", Namespace: "ns", Port: ptr.To[int32](8443)}},
			address: "https://p.ns.svc:8443/", server: "p.ns.svc"},
		"a URL":                       {cc: admissionregv1.WebhookClientConfig{URL: ptr.To("https://10.0.0.5:8000/mutate")}, address: "https://10.0.0.5:8000/mutate", server: "10.0.0.5"},
		"neither":                     {wantErrSubstring: "neither url nor service"},
		"a Service with no namespace": {cc: admissionregv1.WebhookClientConfig{Service: &admissionregv1.ServiceReference{Name: "p"}}, wantErrSubstring: "want a name and a namespace"},
	} {
		t.Run(name, func(t *testing.T) {
			address, server, err := peerwebhook.Address(c.cc)
			if c.wantErrSubstring != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErrSubstring) {
					t.Fatalf("Address = %q, %v; want an error saying %q", address, err, c.wantErrSubstring)
				}
				return
			}
			if err != nil || address != c.address || server != c.server {
				t.Fatalf("Address = %q, %q, %v; want %q, %q", address, server, err, c.address, c.server)
			}
		})
	}
}
