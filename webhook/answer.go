package webhook

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/apijson"
)

// appendReview appends the AdmissionReview that carries resp, byte for
// byte what encoding/json writes for it (TestAppendReviewIsEncodingJSONs).
// Every answer is encoded, and encoding/json walked the whole
// AdmissionResponse by reflection each time (about a tenth of a VM
// mutation's CPU); the answer's members are few and fixed, so they are
// appended here with jsontext's string quoting. A status with details or
// metadata, rare and only on a refusal, is left to encoding/json.
func appendReview(b []byte, apiVersion string, resp *admissionv1.AdmissionResponse) ([]byte, error) {
	b = append(b, `{"kind":"AdmissionReview","apiVersion":`...)
	b, err := apijson.AppendString(b, apiVersion)
	if err != nil {
		return nil, err
	}
	b = append(b, `,"response":{"uid":`...)
	if b, err = apijson.AppendString(b, string(resp.UID)); err != nil {
		return nil, err
	}
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, resp.Allowed)
	if resp.Result != nil {
		b = append(b, `,"status":`...)
		if b, err = appendStatus(b, resp.Result); err != nil {
			return nil, err
		}
	}
	if resp.Patch != nil {
		b = append(b, `,"patch":"`...)
		b = base64.StdEncoding.AppendEncode(b, resp.Patch)
		b = append(b, '"')
	}
	if resp.PatchType != nil {
		b = append(b, `,"patchType":`...)
		if b, err = apijson.AppendString(b, string(*resp.PatchType)); err != nil {
			return nil, err
		}
	}
	if len(resp.AuditAnnotations) > 0 {
		b = append(b, `,"auditAnnotations":{`...)
		for i, k := range slices.Sorted(maps.Keys(resp.AuditAnnotations)) { // as encoding/json orders a map
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = apijson.AppendString(b, k); err != nil {
				return nil, err
			}
			b = append(b, ':')
			if b, err = apijson.AppendString(b, resp.AuditAnnotations[k]); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	if len(resp.Warnings) > 0 {
		b = append(b, `,"warnings":[`...)
		for i, w := range resp.Warnings {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = apijson.AppendString(b, w); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	return append(b, "}}"...), nil
}

// appendStatus appends s as encoding/json writes a metav1.Status.
func appendStatus(b []byte, s *metav1.Status) ([]byte, error) {
	if s.Details != nil || s.TypeMeta != (metav1.TypeMeta{}) || !reflect.ValueOf(s.ListMeta).IsZero() {
		whole, err := json.Marshal(s)
		return append(b, whole...), err
	}
	b = append(b, `{"metadata":{}`...)
	var err error
	for _, f := range []struct{ key, value string }{{"status", s.Status}, {"message", s.Message}, {"reason", string(s.Reason)}} {
		if f.value == "" {
			continue
		}
		b = append(b, `,"`+f.key+`":`...)
		if b, err = apijson.AppendString(b, f.value); err != nil {
			return nil, err
		}
	}
	if s.Code != 0 {
		b = append(b, `,"code":`...)
		b = strconv.AppendInt(b, int64(s.Code), 10)
	}
	return append(b, '}'), nil
}

// answerBuffers hold a request's body, its encoded patch and its answer,
// and the decoded review, from pools: all four are garbage the moment the
// answer is written, and at thousands of requests a second they were a
// fifth of what a VM mutation allocated. Nothing kvnet keeps past the
// answer points into the body or the review: decoding copies what it keeps
// (TestConcurrentAnswersAreTheirOwn).
type answerBuffers struct {
	body, patch, answer *[]byte
	review              *reviewParts
}

// maxPooled bounds what goes back to the pool: one huge answer must not
// stay in memory for good.
const maxPooled = 64 << 10

var bufferPool = sync.Pool{New: func() any { return new([]byte) }}

// get returns an empty buffer of at least size bytes, held in *slot; keep
// sets what was written into it, grown or not.
func (a *answerBuffers) get(slot **[]byte, size int) []byte {
	p := bufferPool.Get().(*[]byte)
	if cap(*p) < size {
		*p = make([]byte, 0, size)
	}
	*slot = p
	return (*p)[:0]
}

// keep records b as what *slot holds (append may have moved it).
func (a *answerBuffers) keep(slot *[]byte, b []byte) {
	if slot != nil {
		*slot = b
	}
}

// release returns the buffers to the pool; nothing may use the body, the
// patch or the answer after it.
func (a *answerBuffers) release() {
	for _, p := range []*[]byte{a.body, a.patch, a.answer} {
		if p != nil && cap(*p) <= maxPooled {
			*p = (*p)[:0]
			bufferPool.Put(p)
		}
	}
	a.body, a.patch, a.answer = nil, nil, nil
	if a.review != nil {
		*a.review = reviewParts{}
		reviewPool.Put(a.review)
		a.review = nil
	}
}
