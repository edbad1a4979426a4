package patch

import (
	"encoding/json"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
)

func applyOps(t *testing.T, raw []byte, ops any) map[string]any {
	t.Helper()
	b, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatchapply.DecodePatch(b)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("patch %s does not apply: %v", b, err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Values under the same missing ancestor share one add; a value whose
// parent exists is added in place.
func TestNested(t *testing.T) {
	raw := []byte(`{"metadata":{"name":"vm"},"spec":{"running":true}}`)
	var n Nested
	n.Add("/metadata/annotations", "", map[string]string{"a": "1"})
	n.Add("/spec/template/spec/networks", "/spec/template", []any{map[string]any{"name": "s"}})
	n.Add("/spec/template/spec/domain/devices/interfaces", "/spec/template", []any{map[string]any{"name": "s"}})
	n.Add("/spec/template/metadata/annotations", "/spec/template", map[string]string{"b": "2"})
	if len(n.Ops) != 2 {
		t.Fatalf("ops = %+v, want one add per missing ancestor", n.Ops)
	}
	got, _ := json.Marshal(applyOps(t, raw, n.Ops))
	want := `{"metadata":{"annotations":{"a":"1"},"name":"vm"},"spec":{"running":true,"template":{"metadata":{"annotations":{"b":"2"}},"spec":{"domain":{"devices":{"interfaces":[{"name":"s"}]}},"networks":[{"name":"s"}]}}}}`
	if string(got) != want {
		t.Errorf("patched = %s\nwant      %s", got, want)
	}
}

// ComputeAt diffs one value against the raw object's and keeps what the
// typed value lacks.
func TestComputeAt(t *testing.T) {
	raw := []byte(`{"spec":{"interfaces":[{"name":"a","future":1},{"name":"b","future":2}]}}`)
	ops, err := ComputeAt(raw, "/spec/interfaces/1", []byte(`{"name":"b"}`), []byte(`{"name":"b","binding":{"name":"vdpa"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 1 || ops[0].Operation != "add" || ops[0].Path != "/spec/interfaces/1/binding" {
		t.Fatalf("ops = %+v, want one add of /spec/interfaces/1/binding", ops)
	}
	got, _ := json.Marshal(applyOps(t, raw, ops))
	if want := `{"spec":{"interfaces":[{"future":1,"name":"a"},{"binding":{"name":"vdpa"},"future":2,"name":"b"}]}}`; string(got) != want {
		t.Errorf("patched = %s", got)
	}
	if _, err := ComputeAt(raw, "/spec/missing", []byte(`{}`), []byte(`{"a":1}`)); err == nil {
		t.Error("ComputeAt on a pointer raw lacks: no error")
	}
}
