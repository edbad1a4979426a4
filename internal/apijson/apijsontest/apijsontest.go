// Package apijsontest holds apijson's fast path to the API server's
// decoder, for the tests and fuzz targets of the types kvnet decodes.
package apijsontest

import (
	"fmt"
	"reflect"

	jsonv2 "github.com/go-json-experiment/json"

	"github.com/kvnet/kvnet/internal/apijson"
)

// Agree decodes raw into a fresh value of newV with v2 alone and with the API server's decoder alone. Where v2 succeeds, the API
// server's decoder must succeed too, with an equal value; where v2
// refuses, apijson uses the API server's decoder, so there is nothing to
// compare. It reports whether v2 decoded raw.
func Agree(raw []byte, newV func() any) (fast bool, err error) {
	v2, v1 := newV(), newV()
	if !apijson.Fast(raw, v2) || jsonv2.Unmarshal(raw, v2) != nil {
		return false, nil
	}
	if err := apijson.V1(raw, v1); err != nil {
		return true, fmt.Errorf("%T: v2 decodes %q, the API server's decoder refuses it: %v", v2, raw, err)
	}
	if !reflect.DeepEqual(v1, v2) {
		return true, fmt.Errorf("%T: decoders disagree on %q:\nv2 %#v\nv1 %#v", v2, raw, v2, v1)
	}
	return true, nil
}
