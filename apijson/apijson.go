// Package apijson decodes the JSON of admitted objects as kube-apiserver
// does, at the cost of one pass over the bytes.
//
// The API server's decoder, sigs.k8s.io/json, is a fork of encoding/json
// v1: it first scans the whole input for validity and then decodes it, and
// on kvnet's views (a few members of an object; the rest skipped) the scan
// and the skipping cost more than the decode. encoding/json/v2 validates
// while it decodes, and decoded kvnet's VM view and AdmissionReview in less
// than half the time. Its implementation is the go-json-experiment/json
// module, which mirrors the standard library's (v2 is stable from Go 1.27;
// the import then becomes encoding/json/v2).
//
// Where the two disagree, the API server's decoder decides. v2 matches
// member names case-sensitively, as the API server does (encoding/json v1
// alone would read "metAdata" as metadata), and ignores unknown members.
// It refuses what v1 takes in a few cases: a duplicate member name, invalid
// UTF-8, trailing data. The API server re-encodes every object it sends,
// so these never reach kvnet from it, but a hand-written review may carry
// them: on any v2 error the input is decoded again, from scratch, by the
// API server's decoder, so what kvnet accepts, the values it decodes and
// the errors it reports stay the API server's. apijsontest.Agree checks
// that wherever v2 succeeds, the API server's decoder gives the same value.
package apijson

import (
	"reflect"

	jsonv2 "github.com/go-json-experiment/json"
	kjson "sigs.k8s.io/json"
)

// Unmarshal decodes raw into v, a non-nil pointer, as the API server does.
// opts are v2 options for the fast path (the v1 decode does not take them),
// such as unmarshalers that must produce what v's own UnmarshalJSON
// methods do.
func Unmarshal(raw []byte, v any, opts ...jsonv2.Options) error {
	if IsObject(raw) && jsonv2.Unmarshal(raw, v, opts...) == nil {
		return nil
	}
	reflect.ValueOf(v).Elem().SetZero()
	return V1(raw, v)
}

// UnmarshalStrict decodes raw into v as Unmarshal does and also returns
// the strict decoding errors the API server reports as warnings or, with
// fieldValidation=Strict, refuses: duplicate member names. v2 refuses any
// duplicate, so when it decodes raw there is none.
func UnmarshalStrict(raw []byte, v any) (strict []error, err error) {
	if IsObject(raw) && jsonv2.Unmarshal(raw, v) == nil {
		return nil, nil
	}
	reflect.ValueOf(v).Elem().SetZero()
	return kjson.UnmarshalStrict(raw, v, kjson.DisallowDuplicateFields)
}

// IsObject reports whether raw starts as a JSON object, the only input
// the fast path takes: a top-level null leaves v1's target as it was and
// resets v2's, and nothing else decodes into kvnet's types.
func IsObject(raw []byte) bool {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c == '{'
	}
	return false
}

// V1 is the API server's own decode, alone.
func V1(raw []byte, v any) error {
	return kjson.UnmarshalCaseSensitivePreserveInts(raw, v)
}
