package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/webhook"
)

func post(t *testing.T, h http.Handler, contentType string, body []byte) *admissionv1.AdmissionReview {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/x", bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
		t.Fatalf("answer is not an AdmissionReview: %v %s", err, w.Body.String())
	}
	return &out
}

// The Edge answers what controller-runtime's admission.Webhook answers: the
// handler's verdict with the request's uid, in the request's
// AdmissionReview version, and a 400 review for a body it cannot read.
func TestEdge(t *testing.T) {
	var seen admission.Request
	h := webhook.Webhook(admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		seen = req
		return admission.Patched("", jsonpatch.Operation{Operation: "add", Path: "/metadata/labels", Value: map[string]string{"a": "b"}})
	}))
	for _, version := range []string{"admission.k8s.io/v1", "admission.k8s.io/v1beta1"} {
		body := `{"apiVersion":"` + version + `","kind":"AdmissionReview","request":{"uid":"u1","operation":"CREATE","namespace":"ns","name":"vm","object":{"metadata":{"name":"vm"}}}}`
		out := post(t, h, "application/json", []byte(body))
		if out.APIVersion != version || out.Kind != "AdmissionReview" {
			t.Errorf("answer is %s %s, want %s AdmissionReview", out.APIVersion, out.Kind, version)
		}
		r := out.Response
		if !r.Allowed || r.UID != "u1" || r.PatchType == nil || string(r.Patch) != `[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]` {
			t.Errorf("%s: answer %+v, patch %s", version, r, r.Patch)
		}
		if seen.Namespace != "ns" || seen.Name != "vm" || string(seen.Object.Raw) != `{"metadata":{"name":"vm"}}` {
			t.Errorf("handler saw %+v", seen.AdmissionRequest)
		}
	}
	for name, c := range map[string]struct {
		contentType, body, want string
	}{
		"empty":        {"application/json", "", "body is empty"},
		"not json":     {"application/json", "{", "decoding the AdmissionReview"},
		"content type": {"text/plain", `{}`, "contentType=text/plain"},
		"other kind":   {"application/json", `{"apiVersion":"v1","kind":"Pod"}`, "want an admission.k8s.io/v1 or v1beta1 AdmissionReview"},
	} {
		out := post(t, h, c.contentType, []byte(c.body))
		if r := out.Response; r.Allowed || r.Result == nil || r.Result.Code != http.StatusBadRequest || !strings.Contains(r.Result.Message, c.want) {
			t.Errorf("%s: answer %+v, want a 400 saying %q", name, r.Result, c.want)
		}
	}
	// Larger than controller-runtime's limit: 413, as it answers.
	big := append([]byte(`{"request":{"uid":"u","object":{"a":"`), bytes.Repeat([]byte("x"), 7<<20)...)
	big = append(big, `"}}}`...)
	if r := post(t, h, "application/json", big).Response; r.Result == nil || r.Result.Code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized review: %+v", r.Result)
	}
	// No type information: decoded as v1, as the universal deserializer does.
	if out := post(t, h, "application/json", []byte(`{"request":{"uid":"u2"}}`)); out.APIVersion != "admission.k8s.io/v1" || out.Response.UID != "u2" {
		t.Errorf("untyped review: %+v", out)
	}
}

// An answer states its length and goes out in one body, not chunked:
// net/http chunks any answer past 2 KB whose length it was not told, and a
// VM gaining networks answers more than that.
func TestEdgeAnswersAreNotChunked(t *testing.T) {
	ops := make([]jsonpatch.Operation, 40)
	for i := range ops {
		ops[i] = jsonpatch.Operation{Operation: "add", Path: "/metadata/labels/l" + strconv.Itoa(i), Value: strings.Repeat("v", 40)}
	}
	srv := httptest.NewServer(webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Patched("", ops...)
	})))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader(`{"request":{"uid":"u"}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(body) < 4<<10 {
		t.Fatalf("the answer is %d bytes; the test needs one past net/http's 2 KB buffer", len(body))
	}
	if len(resp.TransferEncoding) != 0 || resp.ContentLength != int64(len(body)) {
		t.Fatalf("transfer encoding %v, content length %d, for a body of %d bytes: want no chunking and the length stated", resp.TransferEncoding, resp.ContentLength, len(body))
	}
}

// A panic that escapes the handler is a 500 with the request's uid, not a
// dropped connection.
func TestEdgeRecovers(t *testing.T) {
	h := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { panic("boom") }))
	out := post(t, h, "application/json", []byte(`{"request":{"uid":"u3"}}`))
	if r := out.Response; r.Allowed || r.UID != "u3" || r.Result.Code != http.StatusInternalServerError {
		t.Errorf("answer %+v", r)
	}
}

// Lines a handler writes carry the request's identity and the webhook's
// name, as they did under admission.Webhook's logger.
func TestEdgeLogsCarryTheRequest(t *testing.T) {
	var lines []string
	base := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	h := webhook.Webhook(admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		return webhook.Serve(ctx, "mutate-test", req, func(ctx context.Context, _ admission.Request) admission.Response {
			logr.FromContextOrDiscard(ctx).Info("hello", "k", "v")
			logr.FromContextOrDiscard(ctx).WithValues("step", "s").Info("again")
			return admission.Allowed("")
		})
	}))
	h.Log = base
	post(t, h, "application/json", []byte(`{"request":{"uid":"u4","namespace":"ns","name":"vm","userInfo":{"username":"alice"}}}`))
	if len(lines) != 2 {
		t.Fatalf("lines = %q", lines)
	}
	for _, l := range lines {
		for _, want := range []string{`"webhook"="mutate-test"`, `"namespace"="ns"`, `"name"="vm"`, `"user"="alice"`, `"requestID"="u4"`} {
			if !strings.Contains(l, want) {
				t.Errorf("line %s lacks %s", l, want)
			}
		}
	}
	if !strings.Contains(lines[0], `"k"="v"`) || !strings.Contains(lines[1], `"step"="s"`) {
		t.Errorf("lines = %q", lines)
	}
}

// The Edge encodes the patch as controller-runtime does: an add of null
// keeps its "value": null, and a remove has no value.
func TestEdgePatchEncoding(t *testing.T) {
	for want, ops := range map[string][]jsonpatch.Operation{
		`[{"op":"add","path":"/a","value":null}]`:                                  {{Operation: "add", Path: "/a"}},
		`[{"op":"remove","path":"/a"},{"op":"replace","path":"/b","value":false}]`: {{Operation: "remove", Path: "/a"}, {Operation: "replace", Path: "/b", Value: false}},
	} {
		h := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
			return admission.Patched("", ops...)
		}))
		r := post(t, h, "application/json", []byte(`{"request":{"uid":"u"}}`)).Response
		if string(r.Patch) != want || r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch {
			t.Errorf("patch %s (type %v), want %s", r.Patch, r.PatchType, want)
		}
	}
}

// A caller that goes away mid-body (an API server at its webhook timeout)
// gets its 400, but is not logged as an error: nothing is wrong with
// kvnet. A body that is whole but broken still is.
func TestEdgeCallerGoneIsNotAnError(t *testing.T) {
	var errorLines int
	h := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") }))
	h.Log = funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"error"=`) && !strings.Contains(args, `"level"=`) {
			errorLines++
		}
	}, funcr.Options{Verbosity: 1})
	cut := []byte(`{"request":{"uid":"u5","object":{"metadata":`)
	r := httptest.NewRequest(http.MethodPost, "/x", bytes.NewReader(cut))
	r.Header.Set("Content-Type", "application/json")
	r.ContentLength = int64(len(cut)) + 100
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil || out.Response.Result.Code != http.StatusBadRequest {
		t.Fatalf("answer %s: %v", w.Body, err)
	}
	if errorLines != 0 {
		t.Fatalf("a caller gone mid-body was logged as an error")
	}
	post(t, h, "application/json", []byte(`{`))
	if errorLines != 1 {
		t.Fatalf("an undecodable review was logged as %d errors, want 1", errorLines)
	}
}
