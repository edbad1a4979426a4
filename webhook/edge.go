package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	segjson "github.com/segmentio/encoding/json"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/apijson"
)

// maxReview is the largest AdmissionReview kvnet reads: controller-runtime's
// limit (two objects of at most 3 MiB each, and the rest).
const maxReview = 7 << 20

// Edge is an admission handler as the webhook server mounts it: the
// AdmissionReview read and decoded once, the handler's answer completed and
// encoded. It stands in for controller-runtime's admission.Webhook (the
// server around it, with its TLS, certificate watcher and request metrics,
// stays controller-runtime's), whose decoding runs the review through the
// universal deserializer: one pass over the whole body to find its kind and
// another to decode it, each with its own validity scan, before the handler
// decodes the object a third time. Edge decodes the review in one pass,
// with the handler's view of the object in the same pass where the handler
// reads only a view (see viewHandler), and builds the request logger only
// when a line is written (see requestSink).
// Its answers are the same: an undecodable review is a 400 AdmissionReview.
type Edge struct {
	Handler admission.Handler
	// Log is the logger request loggers derive from.
	Log logr.Logger
	// BodyTimeout bounds the read of one request body; zero means
	// DefaultBodyTimeout. Set it before the Edge serves.
	BodyTimeout time.Duration

	bodies bodyWatch
}

// DefaultBodyTimeout is how long a caller may take to send its request
// body. The API server sends a review at once (a few KB, 7 MiB at the
// most, on the cluster network), so this is far more than it needs and
// below its default webhook timeout (10 s, and a call it gave up on needs
// no answer); a client that trickles its body is cut off instead of
// holding a connection and its buffer. controller-runtime's server sets
// no body timeout of its own.
const DefaultBodyTimeout = 5 * time.Second

// Webhook is h as the webhook server mounts it.
func Webhook(h admission.Handler) *Edge {
	return &Edge{Handler: h, Log: logf.Log.WithName("admission")}
}

var errTooLarge = fmt.Errorf("request entity is too large; limit is %d bytes", maxReview)

// review is the AdmissionReview as the API server sends it; v1 and v1beta1
// have the same shape.
type review struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Request    *request `json:"request"`

	// nullRequest records a review whose request was null, which the
	// decode leaves as nil and complete then fills in.
	nullRequest bool
}

// request is the AdmissionRequest with its objects decoded by
// objectField: the outer fields win over the embedded request's, so the
// decoder fills those instead of copying each object into a
// runtime.RawExtension.
type request struct {
	admissionv1.AdmissionRequest
	Object    objectField `json:"object"`
	OldObject objectField `json:"oldObject"`
}

// objectField is one of the review's objects. Its JSON is a slice of the
// review's body, not a copy: the body is read for this one request and
// never written, so the handler can keep the bytes as long as the request.
// If the handler reads only a view of the object (see viewHandler), the
// view is decoded in the review's own pass, so the object's bytes are
// scanned once rather than twice.
type objectField struct {
	// body is the decoder's input, of which raw is a slice.
	body []byte
	// view, if not nil, is what a JSON object here decodes into; decoded
	// reports that it did.
	view    any
	decoded bool
	// raw is the object's JSON; nil for null or a missing object.
	raw []byte
}

// valueStart is the offset of the value that follows a member name ending
// at off: after white space and the colon.
func valueStart(body []byte, off int64) int64 {
	for ; off >= 0 && off < int64(len(body)); off++ {
		switch body[off] {
		case ' ', '\t', '\r', '\n', ':':
		default:
			return off
		}
	}
	return -1
}

// UnmarshalJSON implements json.Unmarshaler for apijson's v1 decode (see
// decodeReview), whose bytes it may not keep, so they are copied; null is
// no value, as for a runtime.RawExtension. No view is decoded.
func (o *objectField) UnmarshalJSON(in []byte) error {
	*o = objectField{}
	if string(in) != "null" {
		o.raw = bytes.Clone(in)
	}
	return nil
}

// decodeReview decodes body as apijson.Unmarshal does, and the request's
// object into view too if view is not nil and the object is a JSON object
// (rv.Request.Object.decoded says whether it was).
//
// The review is scanned by tokens (see scanReview); a review the scan
// refuses is decoded again, from scratch and without the view, by the API
// server's decoder, whose answer stands.
func decodeReview(body []byte, view any) (*review, error) {
	return decodeReviewInto(new(reviewParts), body, view)
}

// reviewParts are a review and its request in one piece, which the Edge
// keeps from one request to the next (answerBuffers): about 650 bytes a
// request that were garbage once the answer was written.
type reviewParts struct {
	review  review
	request request
}

var reviewPool = sync.Pool{New: func() any { return new(reviewParts) }}

// decodeReviewInto is decodeReview into p, whose review it returns.
func decodeReviewInto(p *reviewParts, body []byte, view any) (*review, error) {
	newReview := func(view any) *review {
		p.request = request{Object: objectField{body: body, view: view}, OldObject: objectField{body: body}}
		p.review = review{Request: &p.request}
		return &p.review
	}
	if apijson.IsObject(body) {
		rv := newReview(view)
		if scanReview(body, rv) == nil {
			rv.complete()
			return rv, nil
		}
	}
	rv := newReview(nil)
	if err := apijson.V1(body, rv); err != nil {
		return nil, err
	}
	rv.complete()
	return rv, nil
}

// complete fills in what a decode leaves: a request for "request": null,
// and the AdmissionRequest's objects.
func (rv *review) complete() {
	if rv.Request == nil {
		rv.nullRequest = true
		rv.Request = &request{}
	}
	rv.Request.AdmissionRequest.Object.Raw = rv.Request.Object.raw
	rv.Request.AdmissionRequest.OldObject.Raw = rv.Request.OldObject.raw
}

// viewHandler is a handler that reads only part of the object, its view,
// which the Edge then decodes in the review's own pass.
type viewHandler interface {
	admission.Handler
	// newView returns an empty view to decode the object into.
	newView() any
	// releaseView takes back a view newView returned, once the answer
	// made from it is written.
	releaseView(view any)
	// handleView is Handle with the object decoded into view, or, if
	// view is nil, not decoded yet.
	handleView(ctx context.Context, req admission.Request, view any) admission.Response
}

// ServeHTTP implements http.Handler.
func (e *Edge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var buffers answerBuffers
	defer buffers.release()
	vh, _ := e.Handler.(viewHandler)
	var view any
	if vh != nil {
		view = vh.newView()
		defer vh.releaseView(view)
	}
	rv, err := e.readWatched(w, r, view, &buffers)
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || r.Context().Err() != nil {
			// The caller went away mid-body (an API server giving up at
			// its webhook timeout, a load tool ending its run): nothing is
			// wrong with the request kvnet could report, or with kvnet.
			e.Log.V(1).Info("the caller went away before sending the whole request", "error", err.Error())
		} else {
			e.Log.Error(err, "bad request")
		}
		code := int32(http.StatusBadRequest)
		if errors.Is(err, errTooLarge) {
			code = http.StatusRequestEntityTooLarge
		}
		e.write(w, "", admission.Errored(code, err), &buffers)
		return
	}
	req := admission.Request{AdmissionRequest: rv.Request.AdmissionRequest}
	ctx := logr.NewContext(r.Context(), logr.New(newRequestSink(e.Log.GetSink(), &req)))
	handler := e.Handler.Handle
	if vh != nil {
		if !rv.Request.Object.decoded {
			view = nil
		}
		handler = func(ctx context.Context, req admission.Request) admission.Response {
			return vh.handleView(ctx, req, view)
		}
	}
	resp := e.handle(ctx, req, handler, &buffers)
	e.write(w, rv.APIVersion, resp, &buffers)
}

// readWatched is readReview under the body timeout (bodyWatch), which
// bounds the read only: it cannot cut a slow handler's answer or the next
// request on the connection.
func (e *Edge) readWatched(w http.ResponseWriter, r *http.Request, view any, buffers *answerBuffers) (*review, error) {
	slot := e.bodies.begin(w, cmp.Or(e.BodyTimeout, DefaultBodyTimeout))
	defer e.bodies.end(slot)
	return readReview(r, view, buffers)
}

// readReview reads and decodes the body: JSON, a known AdmissionReview
// version, at most maxReview bytes.
func readReview(r *http.Request, view any, buffers *answerBuffers) (*review, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, errors.New("request body is empty")
	}
	defer r.Body.Close()
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		return nil, fmt.Errorf("contentType=%s, expected application/json", ct)
	}
	body, err := readBody(r.Body, r.ContentLength, buffers.get(&buffers.body, 0))
	buffers.keep(buffers.body, body)
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return nil, err
		}
		return nil, fmt.Errorf("reading the request body: %w", err)
	}
	if len(body) == 0 {
		return nil, errors.New("request body is empty")
	}
	buffers.review = reviewPool.Get().(*reviewParts)
	rv, err := decodeReviewInto(buffers.review, body, view)
	if err != nil {
		return nil, fmt.Errorf("decoding the AdmissionReview: %w", err)
	}
	switch {
	case rv.APIVersion == "" && rv.Kind == "":
		// As the universal deserializer does for an object without type
		// information: decode it as the type asked for.
	case rv.Kind != "AdmissionReview" || (rv.APIVersion != "admission.k8s.io/v1" && rv.APIVersion != "admission.k8s.io/v1beta1"):
		return nil, fmt.Errorf("want an admission.k8s.io/v1 or v1beta1 AdmissionReview, got %s %s", rv.APIVersion, rv.Kind)
	}
	// An answer must carry the request's UID, or the API server rejects
	// it; a review without one is not something kvnet can answer.
	switch {
	case rv.nullRequest:
		return nil, errors.New("the AdmissionReview's request is null")
	case rv.Request.UID == "":
		return nil, errors.New("the AdmissionReview's request.uid is empty")
	}
	return rv, nil
}

// firstRead is how much of a body kvnet makes room for before any of it
// has arrived: every AdmissionReview the API server sends for a VM or a
// launcher pod fits (a launcher pod's is about 11 KB), and a client that
// announces a large body and then sends it slowly holds no more than this
// until its bytes really come.
const firstRead = 64 << 10

// readBody reads a body of at most maxReview bytes, growing its buffer as
// bytes arrive rather than by what Content-Length announces (announced is
// only a hint, up to firstRead), into buf when it is large enough.
func readBody(r io.Reader, announced int64, buf []byte) ([]byte, error) {
	if announced > maxReview {
		return nil, errTooLarge
	}
	size := int64(512)
	if announced > 0 {
		size = min(announced, firstRead) + 1 // +1: room to see the EOF without growing
	}
	if int64(cap(buf)) < size {
		buf = make([]byte, 0, size)
	}
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			if len(buf) > maxReview {
				return nil, errTooLarge
			}
			buf = slices.Grow(buf, min(len(buf), maxReview+1-len(buf)))
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if len(buf) > maxReview {
			return nil, errTooLarge
		}
		if err == io.EOF {
			if int64(len(buf)) < announced {
				return nil, io.ErrUnexpectedEOF // the caller went away mid-body
			}
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// handle runs the handler and completes its answer. A panic here is a
// second net: kvnet's handlers run in Serve, which recovers their own.
func (e *Edge) handle(ctx context.Context, req admission.Request, handler func(context.Context, admission.Request) admission.Response, buffers *answerBuffers) (resp admission.Response) {
	defer func() {
		if p := recover(); p != nil {
			logf.FromContext(ctx).Error(fmt.Errorf("%v", p), "handler panicked")
			resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("panic: %v [recovered]", p))
			resp.UID = req.UID
		}
	}()
	resp = handler(ctx, req)
	if err := encodePatch(&resp, buffers); err != nil {
		logf.FromContext(ctx).Error(err, "unable to encode the patch")
		resp = admission.Errored(http.StatusInternalServerError, errors.New("unable to encode response"))
	}
	if err := resp.Complete(req); err != nil {
		logf.FromContext(ctx).Error(err, "unable to encode response")
		resp = admission.Errored(http.StatusInternalServerError, errors.New("unable to encode response"))
		resp.UID = req.UID
	}
	return resp
}

// patchOp is jsonpatch.Operation without its MarshalJSON: encoding/json
// re-scans and compacts what a MarshalJSON returns, once per operation, so
// a list of these encodes in one pass.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// encodePatch encodes resp.Patches into resp.Patch, as resp.Complete
// would. An add or replace of a nil value (which must say "value": null,
// where omitempty would drop it) is left to Complete.
func encodePatch(resp *admission.Response, buffers *answerBuffers) error {
	if len(resp.Patches) == 0 {
		return nil
	}
	for _, op := range resp.Patches {
		if op.Value == nil && (op.Operation == "add" || op.Operation == "replace") {
			return nil
		}
	}
	buf := buffers.get(&buffers.patch, 2<<10)
	b, ok := appendOps(buf, resp.Patches)
	if !ok {
		// A value appendOps does not write. segmentio/encoding writes what
		// encoding/json writes (the flags are its Marshal's,
		// TestPatchEncodingIsEncodingJSONs holds them to the same bytes) in
		// a third of its time.
		ops := make([]patchOp, len(resp.Patches))
		for i, op := range resp.Patches {
			ops[i] = patchOp{Op: op.Operation, Path: op.Path, Value: op.Value}
		}
		var err error
		if b, err = segjson.Append(buf[:0], ops, segjson.EscapeHTML|segjson.SortMapKeys); err != nil {
			return err
		}
	}
	buffers.keep(buffers.patch, b)
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType, resp.Patches = b, &pt, nil
	return nil
}

// write encodes the answer as an AdmissionReview of the request's version
// (v1 when the request named none).
func (e *Edge) write(w http.ResponseWriter, apiVersion string, resp admission.Response, buffers *answerBuffers) {
	if apiVersion == "" {
		apiVersion = "admission.k8s.io/v1"
	}
	size := 256 + base64.StdEncoding.EncodedLen(len(resp.Patch))
	for _, w := range resp.Warnings {
		size += len(w) + 8
	}
	b, err := appendReview(buffers.get(&buffers.answer, size), apiVersion, &resp.AdmissionResponse)
	buffers.keep(buffers.answer, b)
	if err != nil {
		e.Log.Error(err, "unable to encode the response")
		failed := admission.Errored(http.StatusInternalServerError, err)
		failed.UID = resp.UID
		b, _ = json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: "AdmissionReview"},
			Response: &failed.AdmissionResponse,
		})
	}
	// With its length stated, the answer goes out as one body, however
	// large: without it net/http sends any answer past 2 KB chunked (a VM
	// gaining four networks answers 2.3 KB), which costs both ends a
	// chunked framing and the API server a chunked read.
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if _, err := w.Write(b); err != nil {
		e.Log.V(1).Info("writing the response failed", "error", err.Error())
	}
}

// requestSink is the request's logger: the lines it writes carry the keys
// controller-runtime's admission.Webhook adds (object, namespace, name,
// resource, user, requestID) and the webhook's name, but the keys are
// attached only to lines actually written. The logging library encodes the
// values of WithValues at once, which on the success path, where kvnet
// writes nothing, cost every request an encoding of six fields for no line
// at all. Hand-written because logr has no lazy WithValues.
type requestSink struct {
	base    logr.LogSink
	req     *admission.Request
	webhook string
}

func newRequestSink(base logr.LogSink, req *admission.Request) *requestSink {
	// One more frame (this sink) between the caller and the base sink.
	if cd, ok := base.(logr.CallDepthLogSink); ok {
		base = cd.WithCallDepth(1)
	}
	return &requestSink{base: base, req: req}
}

func (s *requestSink) values(kv []any) []any {
	r := s.req
	out := make([]any, 0, 14+len(kv))
	if s.webhook != "" {
		out = append(out, "webhook", s.webhook)
	}
	out = append(out, "object", klog.KRef(r.Namespace, r.Name), "namespace", r.Namespace, "name", r.Name,
		"resource", r.Resource, "user", r.UserInfo.Username, "requestID", r.UID)
	return append(out, kv...)
}

// Init implements logr.LogSink; the base sink was initialised by its own logger.
func (s *requestSink) Init(logr.RuntimeInfo) {}

// Enabled implements logr.LogSink.
func (s *requestSink) Enabled(level int) bool { return s.base.Enabled(level) }

// Info implements logr.LogSink.
func (s *requestSink) Info(level int, msg string, kv ...any) {
	s.base.Info(level, msg, s.values(kv)...)
}

// Error implements logr.LogSink.
func (s *requestSink) Error(err error, msg string, kv ...any) {
	s.base.Error(err, msg, s.values(kv)...)
}

// WithValues implements logr.LogSink: a logger a step keeps for several
// lines pays for the keys once. controller-runtime's log.FromContext calls
// it without values on every call; that costs nothing.
func (s *requestSink) WithValues(kv ...any) logr.LogSink {
	if len(kv) == 0 {
		return s
	}
	return s.base.WithValues(s.values(kv)...)
}

// WithName implements logr.LogSink.
func (s *requestSink) WithName(name string) logr.LogSink {
	c := *s
	c.base = s.base.WithName(name)
	return &c
}

// withWebhook is ctx with its request logger naming the webhook: free when
// the logger is the Edge's, a WithValues otherwise (a handler called
// directly, as the offline CLI and tests do).
func withWebhook(ctx context.Context, webhook string) (context.Context, logr.Logger) {
	log := logf.FromContext(ctx)
	if s, ok := log.GetSink().(*requestSink); ok {
		c := *s
		c.webhook = webhook
		log = logr.New(&c)
	} else {
		log = log.WithValues("webhook", webhook)
	}
	return logr.NewContext(ctx, log), log
}
