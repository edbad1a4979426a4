package patch_test

import (
	"reflect"
	"testing"

	"github.com/kvnet/kvnet/internal/patch"
)

// StringMap says per key what changed, escapes keys, and adds a map the
// object lacks whole; every result applies to the object.
func TestStringMap(t *testing.T) {
	raw := `{"metadata":{"annotations":{"a/b":"1","gone":"x","same":"s"}}}`
	ops := patch.StringMap("/metadata/annotations", true,
		map[string]string{"a/b": "1", "gone": "x", "same": "s"},
		map[string]string{"a/b": "2", "new~": "n", "same": "s"})
	want := []opPath{{"replace", "/metadata/annotations/a~1b"}, {"add", "/metadata/annotations/new~0"}, {"remove", "/metadata/annotations/gone"}}
	if !sameOps(opPaths(ops), want) {
		t.Fatalf("ops = %v, want %v", opPaths(ops), want)
	}
	got := apply(t, raw, ops)
	if w := jsonValue(t, `{"metadata":{"annotations":{"a/b":"2","new~":"n","same":"s"}}}`); !reflect.DeepEqual(got, w) {
		t.Fatalf("applied: %v, want %v", got, w)
	}

	ops = patch.StringMap("/metadata/labels", false, nil, map[string]string{"k": "v"})
	if got := apply(t, `{"metadata":{"name":"p"}}`, ops); !reflect.DeepEqual(got, jsonValue(t, `{"metadata":{"name":"p","labels":{"k":"v"}}}`)) {
		t.Fatalf("absent map: %v", got)
	}
	if ops := patch.StringMap("/metadata/labels", true, map[string]string{"k": "v"}, map[string]string{"k": "v"}); ops != nil {
		t.Fatalf("no change gave %v", ops)
	}
}

// A snapshot is a copy: the map changed after it is patched from what it
// held then.
func TestSnapshotIsACopy(t *testing.T) {
	m := map[string]string{"b": "2", "a": "1", "c": "3"}
	snap := patch.Snapshot(m)
	m["a"], m["d"] = "changed", "4"
	delete(m, "c")
	if v, ok := snap.Get("a"); !ok || v != "1" {
		t.Fatalf("snapshot's a = %q, %v", v, ok)
	}
	if _, ok := snap.Get("d"); ok {
		t.Fatal("the snapshot holds a key added after it")
	}
	ops := patch.StringMapSince("/m", true, snap, m)
	want := []opPath{{"replace", "/m/a"}, {"remove", "/m/c"}, {"add", "/m/d"}}
	if !sameOps(opPaths(ops), want) {
		t.Fatalf("ops = %v, want %v", opPaths(ops), want)
	}
	if patch.Snapshot(nil) != nil || patch.StringMapSince("/m", true, nil, map[string]string{}) != nil {
		t.Fatal("an empty map is an empty snapshot, and no change from one")
	}
}
