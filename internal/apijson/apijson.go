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
	"encoding/json"
	"reflect"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	kjson "sigs.k8s.io/json"
)

// Unmarshal decodes raw into v, a non-nil pointer, as the API server does.
// When v2's decode fails, v is reset before the API server's decoder
// decodes raw into it, so nothing v2 wrote is left.
func Unmarshal(raw []byte, v any) error {
	if Fast(raw, v) {
		if jsonv2.Unmarshal(raw, v) == nil {
			return nil
		}
		reflect.ValueOf(v).Elem().SetZero()
	}
	return V1(raw, v)
}

// Duplicate is a member name an object gives twice. The API server warns
// of one (with fieldValidation=Strict, refuses it) and keeps the last
// copy; it is not a decoding failure.
type Duplicate struct {
	// Path is the member's field path, as "spec.containers[2].resources"
	// ("" when the decoder does not say).
	Path string
	// Message is the decoder's text, which names the member.
	Message string
}

// UnmarshalStrict decodes raw into v as Unmarshal does and also returns
// the member names raw gives twice, which the API server's strict decoding
// reports. v2 refuses any duplicate, so when it decodes raw there is none.
func UnmarshalStrict(raw []byte, v any) ([]Duplicate, error) {
	if Fast(raw, v) {
		if jsonv2.Unmarshal(raw, v) == nil {
			return nil, nil
		}
		reflect.ValueOf(v).Elem().SetZero()
	}
	strict, err := kjson.UnmarshalStrict(raw, v, kjson.DisallowDuplicateFields)
	if err != nil || len(strict) == 0 {
		return nil, err
	}
	dups := make([]Duplicate, len(strict))
	for i, e := range strict {
		dups[i].Message = e.Error()
		if f, ok := e.(interface{ FieldPath() string }); ok {
			dups[i].Path = f.FieldPath()
		}
	}
	return dups, nil
}

// Fast reports whether the v2 decode is tried for raw into v: raw must be
// a JSON object (a top-level null leaves v1's target as it was and resets
// v2's), and v must decode alike in both (DecodesAlike).
func Fast(raw []byte, v any) bool {
	return IsObject(raw) && DecodesAlike(v)
}

// DecodesAlike reports whether v2 and the API server's decoder fill a
// value of v's type alike: it holds no interface value (the API server's
// decoder reads an integer in an any as an int64, v2 as a float64). The
// check stops at a type that decodes itself; such a type that decodes a
// value of its own with v2 must ask this of that value (webhook's review
// objects do, for the views they decode).
func DecodesAlike(v any) bool {
	return !holdsInterface(reflect.TypeOf(v))
}

// IsObject reports whether raw starts as a JSON object.
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

var interfaceTypes sync.Map // reflect.Type -> bool

// holdsInterface reports whether a value of type t can hold an interface
// value that the decoders fill: in a field, element or map value, except
// below a type that decodes itself (json.Unmarshaler), which both
// decoders call alike.
func holdsInterface(t reflect.Type) bool {
	if t == nil {
		return true
	}
	if v, ok := interfaceTypes.Load(t); ok {
		return v.(bool)
	}
	holds := walkInterface(t, map[reflect.Type]bool{})
	interfaceTypes.Store(t, holds)
	return holds
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

func walkInterface(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	if t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(unmarshaler) {
		return false
	}
	switch t.Kind() {
	case reflect.Interface:
		return true
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return walkInterface(t.Elem(), seen)
	case reflect.Map:
		return walkInterface(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); (f.IsExported() || f.Anonymous) && f.Tag.Get("json") != "-" && walkInterface(f.Type, seen) {
				return true
			}
		}
	}
	return false
}
