package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
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

// dropNetwork takes one network and its interface out of the VM and
// records it, as no mutator does today; the patch must still be right.
type dropNetwork struct{ name string }

func (dropNetwork) Name() string { return "drop" }

func (d dropNetwork) Mutate(_ context.Context, req *chain.Request) error {
	req.Spec.Networks = slices.DeleteFunc(req.Spec.Networks, func(n kubevirtv1.Network) bool { return n.Name == d.name })
	ifaces := &req.Spec.Domain.Devices.Interfaces
	*ifaces = slices.DeleteFunc(*ifaces, func(i kubevirtv1.Interface) bool { return i.Name == d.name })
	req.Record("drop", "test", d.name)
	return nil
}

// A network taken out of the middle of the lists is removed at its index:
// the fields kvnet's types do not hold (a newer KubeVirt's, here "future")
// stay with the elements that had them, instead of sliding onto the
// element that moved into the removed one's place.
func TestVMPatchRemovesFromTheMiddle(t *testing.T) {
	vm := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"db","namespace":"tenant-a"},
  "spec":{"template":{"spec":{"domain":{"devices":{"interfaces":[
    {"name":"a","bridge":{},"future":"a"},{"name":"b","bridge":{},"future":"b"},{"name":"c","bridge":{},"future":"c"}]}},
  "networks":[{"name":"a","multus":{"networkName":"na"},"future":"a"},{"name":"b","multus":{"networkName":"nb"},"future":"b"},{"name":"c","multus":{"networkName":"nc"},"future":"c"}]}}}}`
	h := &webhook.VMMutateHandler{Kind: chain.KindVM, Config: config.Static(&config.Config{}), Facts: exampleFacts(t), Mutators: []chain.VMMutator{dropNetwork{"b"}}}
	resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "", []byte(vm), nil))
	if !resp.Allowed {
		t.Fatalf("refused: %v", resp.Result)
	}
	var got struct {
		Spec struct {
			Template struct {
				Spec struct {
					Domain struct {
						Devices struct {
							Interfaces []map[string]any `json:"interfaces"`
						} `json:"devices"`
					} `json:"domain"`
					Networks []map[string]any `json:"networks"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(applyResponse(t, []byte(vm), resp), &got); err != nil {
		t.Fatal(err)
	}
	s := got.Spec.Template.Spec
	for what, list := range map[string][]map[string]any{"networks": s.Networks, "interfaces": s.Domain.Devices.Interfaces} {
		var names []string
		for _, e := range list {
			names = append(names, fmt.Sprintf("%v/%v", e["name"], e["future"]))
		}
		if strings.Join(names, ",") != "a/a,c/c" {
			t.Errorf("%s after removing b: %v, want [a/a c/c]; patch %+v", what, names, resp.Patches)
		}
	}
}

// reorder swaps the first two networks, which no mutator may do.
type reorder struct{}

func (reorder) Name() string { return "reorder" }

func (reorder) Mutate(_ context.Context, req *chain.Request) error {
	n := req.Spec.Networks
	n[0], n[1] = n[1], n[0]
	req.Record("reorder", "test", n[0].Name)
	return nil
}

// A mutator that reorders a list is kvnet's bug: a 500 naming the list,
// not a patch that would mix up the elements' fields.
func TestVMPatchRefusesReordering(t *testing.T) {
	vm := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"db","namespace":"tenant-a"},
  "spec":{"template":{"spec":{"domain":{"devices":{}},"networks":[{"name":"a","pod":{}},{"name":"b","multus":{"networkName":"nb"}}]}}}}`
	h := &webhook.VMMutateHandler{Kind: chain.KindVM, Config: config.Static(&config.Config{}), Facts: exampleFacts(t), Mutators: []chain.VMMutator{reorder{}}}
	resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "", []byte(vm), nil))
	if resp.Allowed || code(resp) != 500 || !strings.Contains(resp.Result.Message, "/spec/template/spec/networks") {
		t.Fatalf("allowed=%v code=%d %v; want a 500 naming the networks", resp.Allowed, code(resp), resp.Result)
	}
	// Through the Edge the lists are scanned whole and would be replaced
	// whole: the reordering is refused all the same.
	req := review(chain.KindVM, admissionv1.Create, "", []byte(vm), nil)
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &req.AdmissionRequest,
	})
	if err != nil {
		t.Fatal(err)
	}
	out := post(t, webhook.Webhook(h), "application/json", body).Response
	if out.Allowed || out.Result == nil || out.Result.Code != 500 || !strings.Contains(out.Result.Message, "/spec/template/spec/networks") {
		t.Fatalf("through the Edge: allowed=%v %v; want a 500 naming the networks", out.Allowed, out.Result)
	}
}

// touchAll changes every region once: a key in each map, a network and
// an interface appended, multiqueue on, memory set.
type touchAll struct{ pointers *[]string }

func (touchAll) Name() string { return "touch" }

func (m touchAll) Mutate(_ context.Context, req *chain.Request) error {
	rs := req.Regions()
	for _, r := range rs.Maps {
		if *r.Field == nil {
			*r.Field = map[string]string{}
		}
		(*r.Field)["example.com/touched"] = "yes"
	}
	*rs.Networks.Field = append(*rs.Networks.Field, kubevirtv1.Network{Name: "t", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "t"}}})
	*rs.Interfaces.Field = append(*rs.Interfaces.Field, kubevirtv1.Interface{Name: "t", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}})
	*rs.Multiqueue.Field = ptr.To(true)
	*rs.Memory.Field = &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))}
	*m.pointers = rs.Pointers()
	req.Record("touch", "test", "t")
	return nil
}

// Every region a mutator may write reaches the patch, on a VM that has
// each member and on one that has none. A region added to chain.Regions
// fails here until touchAll changes it and vmPatch patches it.
func TestEveryRegionIsPatched(t *testing.T) {
	var fields []string
	for f := range reflect.TypeFor[chain.Regions]().Fields() {
		fields = append(fields, f.Name)
	}
	if want := []string{"Maps", "Networks", "Interfaces", "Multiqueue", "Memory"}; !slices.Equal(fields, want) {
		t.Fatalf("chain.Regions has %v; this test and webhook/vmpatch.go handle %v", fields, want)
	}
	full := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"db","namespace":"tenant-a","annotations":{"a":"b"},"labels":{"a":"b"}},
  "spec":{"template":{"metadata":{"annotations":{"a":"b"},"labels":{"a":"b"}},"spec":{"domain":{"memory":{"guest":"2Gi"},"devices":{"networkInterfaceMultiqueue":false,"interfaces":[{"name":"default","masquerade":{}}]}},"networks":[{"name":"default","pod":{}}]}}}}`
	bare := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"db","namespace":"tenant-a"},"spec":{}}`
	for name, vm := range map[string]string{"every member": full, "no member": bare} {
		var pointers []string
		h := &webhook.VMMutateHandler{Kind: chain.KindVM, Config: config.Static(&config.Config{}), Facts: exampleFacts(t), Mutators: []chain.VMMutator{touchAll{&pointers}}}
		resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "", []byte(vm), nil))
		if !resp.Allowed {
			t.Fatalf("%s: refused: %v", name, resp.Result)
		}
		patched := applyResponse(t, []byte(vm), resp)
		for _, p := range pointers {
			reached := false
			for _, op := range resp.Patches {
				reached = reached || strings.HasPrefix(op.Path, p) || strings.HasPrefix(p, op.Path) && op.Operation == "add"
			}
			if !reached {
				t.Errorf("%s: no operation reaches %s; patch %+v", name, p, resp.Patches)
			}
		}
		if !bytes.Contains(patched, []byte(`"networkInterfaceMultiqueue":true`)) || !bytes.Contains(patched, []byte(`"guest":"1Gi"`)) {
			t.Errorf("%s: patched VM lacks multiqueue or memory: %s", name, patched)
		}
	}
}
