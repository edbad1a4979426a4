package webhook_test

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/webhook"
)

// The VM patch is the mutators' changes, not a diff: one add at the end
// of the list per network and interface they appended (the whole list
// where the VM had none), one op per annotation key, and nothing outside
// the regions.
func TestVMPatchIsTheChanges(t *testing.T) {
	hs := exampleHandlers(t)
	declared := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
  "metadata":{"name":"db","namespace":"tenant-a","labels":{"app.kubernetes.io/component":"database"}},
  "spec":{"template":{"metadata":{},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}}]}},"networks":[{"name":"default","pod":{}}]}}}}`
	for name, c := range map[string]struct {
		raw []byte
		// whole-list adds and appends of networks and interfaces
		lists, at int
	}{
		"no networks":      {toJSON(t, benchVM), 2, 0},
		"declared network": {[]byte(declared), 0, 4},
	} {
		resp, _ := mutate(t, hs, chain.KindVM, admissionv1.Create, c.raw, nil)
		if !resp.Allowed {
			t.Fatalf("%s: refused: %v", name, resp.Result)
		}
		lists, at := 0, 0
		for _, op := range resp.Patches {
			switch {
			case op.Operation == "add" && (op.Path == "/spec/template/spec/networks" || op.Path == "/spec/template/spec/domain/devices/interfaces"):
				lists++
			case op.Operation == "add" && (op.Path == "/spec/template/spec/networks/-" || op.Path == "/spec/template/spec/domain/devices/interfaces/-"):
				at++
			case strings.HasPrefix(op.Path, "/metadata/annotations"), strings.HasPrefix(op.Path, "/spec/template/metadata/annotations"),
				op.Path == "/spec/template/spec/domain/devices/networkInterfaceMultiqueue", op.Path == "/spec/template/spec/domain/memory":
				if op.Operation != "add" {
					t.Errorf("%s: %s %s: the VM had no such member", name, op.Operation, op.Path)
				}
			default:
				t.Errorf("%s: unexpected operation %s %s", name, op.Operation, op.Path)
			}
		}
		if lists != c.lists || at != c.at {
			t.Errorf("%s: %d whole-list adds and %d appends, want %d and %d; patch %+v", name, lists, at, c.lists, c.at, resp.Patches)
		}
	}
}

// An object that gives a member the patch relies on twice is refused with
// the member's name, not patched at a member its last copy lacks.
func TestVMPatchRefusesDuplicateMembers(t *testing.T) {
	hs := exampleHandlers(t)
	raw := []byte(`{"metadata":{"name":"vm","namespace":"tenant-a","annotations":{"a":"b"}},"metadata":{"name":"vm","namespace":"tenant-a"},"spec":{"template":{"spec":{}}}}`)
	resp := hs[webhook.PathMutateVM].Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "tenant-a", raw, nil))
	if resp.Allowed || code(resp) != 400 || !strings.Contains(resp.Result.Message, `duplicate field "metadata"`) {
		t.Fatalf("answer %+v, want a 400 naming metadata", resp.Result)
	}
}
