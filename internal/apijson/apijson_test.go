package apijson_test

import (
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/apijson/apijsontest"
)

type meta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type object struct {
	Metadata *meta `json:"metadata"`
	Count    int64 `json:"count"`
}

type withAny struct {
	Any any `json:"any"`
}

// What v2 refuses, the API server's decoder decides: the values are v1's.
func TestUnmarshalIsTheAPIServers(t *testing.T) {
	for _, c := range []struct {
		name, in string
		fast     bool
		want     func(*object) bool
	}{
		{"plain", `{"metadata":{"name":"a","labels":{"k":"v"}},"count":3}`, true,
			func(o *object) bool { return o.Metadata.Name == "a" && o.Metadata.Labels["k"] == "v" && o.Count == 3 }},
		{"names are case-sensitive", `{"Metadata":{"name":"a"},"COUNT":3}`, true,
			func(o *object) bool { return o.Metadata == nil && o.Count == 0 }},
		{"duplicate name: v1 takes the last", `{"count":1,"count":2}`, false,
			func(o *object) bool { return o.Count == 2 }},
		{"invalid UTF-8: v1 replaces it", "{\"metadata\":{\"name\":\"a\xffb\"}}", false,
			func(o *object) bool { return o.Metadata.Name == "a\ufffdb" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o object
			if err := apijson.Unmarshal([]byte(c.in), &o); err != nil {
				t.Fatal(err)
			}
			if !c.want(&o) {
				t.Fatalf("decoded %+v (metadata %+v)", o, o.Metadata)
			}
			fast, err := apijsontest.Agree([]byte(c.in), func() any { return new(object) })
			if err != nil {
				t.Fatal(err)
			}
			if fast != c.fast {
				t.Fatalf("fast path %v, want %v", fast, c.fast)
			}
		})
	}
}

// A type that can hold an interface value is left to the API server's
// decoder, which reads integers in it as int64 where v2 reads float64.
func TestUnmarshalKeepsIntegersInAny(t *testing.T) {
	var v withAny
	if err := apijson.Unmarshal([]byte(`{"any":{"n":7}}`), &v); err != nil {
		t.Fatal(err)
	}
	if n, ok := v.Any.(map[string]any)["n"].(int64); !ok || n != 7 {
		t.Fatalf("any = %#v, want an int64 7", v.Any)
	}
	if apijson.Fast([]byte(`{}`), &v) || apijson.Fast([]byte(`{}`), new(map[string][]any)) {
		t.Fatal("a type holding an any takes the fast path")
	}
	if !apijson.Fast([]byte(` {}`), new(object)) || apijson.Fast([]byte(`null`), new(object)) {
		t.Fatal("Fast disagrees on a plain type")
	}
}

// A top-level null leaves the value as it was, as v1 does.
func TestUnmarshalNullKeepsTheValue(t *testing.T) {
	o := object{Count: 5}
	if err := apijson.Unmarshal([]byte(` null`), &o); err != nil || o.Count != 5 {
		t.Fatalf("count %d, err %v", o.Count, err)
	}
}

// Errors are the API server decoder's, not v2's.
func TestUnmarshalErrorsAreV1s(t *testing.T) {
	var o object
	err := apijson.Unmarshal([]byte(`{"count":"x"}`), &o)
	if err == nil || !strings.Contains(err.Error(), "json: cannot unmarshal string into Go struct field") {
		t.Fatalf("error %v", err)
	}
}

// UnmarshalStrict reports duplicate names as the API server's strict
// decoding does, and none when v2 decoded the input.
func TestUnmarshalStrict(t *testing.T) {
	var o object
	dups, err := apijson.UnmarshalStrict([]byte(`{"metadata":{"name":"a","name":"b"}}`), &o)
	if err != nil || len(dups) != 1 || dups[0].Path != "metadata.name" || !strings.Contains(dups[0].Message, `duplicate field "metadata.name"`) || o.Metadata.Name != "b" {
		t.Fatalf("duplicates %+v, err %v, name %q", dups, err, o.Metadata.Name)
	}
	o = object{}
	if dups, err := apijson.UnmarshalStrict([]byte(`{"metadata":{"name":"a"}}`), &o); err != nil || len(dups) != 0 || o.Metadata.Name != "a" {
		t.Fatalf("duplicates %+v, err %v", dups, err)
	}
}
