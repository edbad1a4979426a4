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

func TestComputeRegions(t *testing.T) {
	raw := []byte(`{"metadata":{"name":"vm"},"spec":{"template":{"spec":{"networks":[{"name":"default","pod":{},"future":1}],"domain":{"devices":{}}}}},"status":{"x":1}}`)
	regions := []Region{
		{Pointer: "/metadata/annotations", Before: []byte(`null`), After: []byte(`{"kvnet.io/mutations":"[]"}`)},
		{Pointer: "/spec/template/metadata/annotations", Before: []byte(`null`), After: []byte(`{"a/b":"1"}`)},
		{Pointer: "/spec/template/metadata/labels", Before: []byte(`null`), After: []byte(`{"l":"v"}`)},
		{Pointer: "/spec/template/spec/networks", Before: []byte(`[{"name":"default","pod":{}}]`), After: []byte(`[{"name":"default","pod":{}},{"name":"s","multus":{"networkName":"s"}}]`)},
		{Pointer: "/spec/template/spec/domain/memory", Before: []byte(`null`), After: []byte(`null`)},
	}
	ops, err := ComputeRegions(raw, regions)
	if err != nil {
		t.Fatal(err)
	}
	got := applyOps(t, raw, ops)
	tmpl := got["spec"].(map[string]any)["template"].(map[string]any)
	meta, ok := tmpl["metadata"].(map[string]any)
	if !ok {
		t.Fatalf("template metadata not added: %v", tmpl)
	}
	if meta["annotations"].(map[string]any)["a/b"] != "1" || meta["labels"].(map[string]any)["l"] != "v" {
		t.Fatalf("both template regions must be in the one lifted add: %v", meta)
	}
	nets := tmpl["spec"].(map[string]any)["networks"].([]any)
	if len(nets) != 2 || nets[0].(map[string]any)["future"] != float64(1) {
		t.Fatalf("networks = %v: want the unknown key of the first kept and the second appended", nets)
	}
	if got["status"].(map[string]any)["x"] != float64(1) {
		t.Fatalf("status lost: %v", got)
	}
	if got["metadata"].(map[string]any)["annotations"].(map[string]any)["kvnet.io/mutations"] != "[]" {
		t.Fatalf("annotations = %v", got["metadata"])
	}
	for _, op := range ops {
		if op.Operation == "remove" {
			t.Fatalf("unexpected remove %v", op)
		}
	}
}

func TestComputeRegionsNoChange(t *testing.T) {
	ops, err := ComputeRegions([]byte(`{}`), []Region{{Pointer: "/a", Before: []byte(`{"x":1}`), After: []byte(`{"x":1}`)}})
	if err != nil || len(ops) != 0 {
		t.Fatalf("ops=%v err=%v, want none", ops, err)
	}
}
