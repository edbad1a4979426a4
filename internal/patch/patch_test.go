package patch_test

import (
	"encoding/json"
	"reflect"
	"sort"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/patch"
)

// roundTrip decodes raw into T, marshals it (before), applies mutate and
// marshals again (after): what the webhook does.
func roundTrip[T any](t *testing.T, raw string, mutate func(*T)) (before, after []byte) {
	t.Helper()
	var obj T
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		t.Fatal(err)
	}
	before, _ = json.Marshal(&obj)
	mutate(&obj)
	after, _ = json.Marshal(&obj)
	return before, after
}

func apply(t *testing.T, raw string, ops []jsonpatch.Operation) map[string]any {
	t.Helper()
	b, _ := json.Marshal(ops)
	p, err := jsonpatchapply.DecodePatch(b)
	if err != nil {
		t.Fatalf("decoding patch %s: %v", b, err)
	}
	out, err := p.Apply([]byte(raw))
	if err != nil {
		t.Fatalf("applying %s to %s: %v", b, raw, err)
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func jsonValue(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return m
}

type opPath struct{ Op, Path string }

// sameOps compares operations as a set: map members come in any order.
func sameOps(a, b []opPath) bool {
	key := func(o []opPath) []string {
		var s []string
		for _, x := range o {
			s = append(s, x.Op+" "+x.Path)
		}
		sort.Strings(s)
		return s
	}
	return reflect.DeepEqual(key(a), key(b))
}

func opPaths(ops []jsonpatch.Operation) []opPath {
	var out []opPath
	for _, o := range ops {
		out = append(out, opPath{o.Operation, o.Path})
	}
	return out
}

func TestComputeNoChange(t *testing.T) {
	raw := `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"},"spec":{"somethingNew":1}}`
	before, after := roundTrip(t, raw, func(*kubevirtv1.VirtualMachine) {})
	ops, err := patch.Compute([]byte(raw), before, after)
	if err != nil || ops != nil {
		t.Fatalf("ops = %v, err = %v; want none", ops, err)
	}
}

func TestCompute(t *testing.T) {
	cases := map[string]struct {
		raw    string
		mutate func(*kubevirtv1.VirtualMachine)
		ops    []opPath
		want   string // the patched raw object
	}{
		"template metadata absent in raw: the whole metadata is added": {
			raw: `{"metadata":{"name":"a"},"spec":{"template":{"spec":{"domain":{"devices":{}}}}}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				vm.Spec.Template.ObjectMeta.Annotations = map[string]string{"x.kubernetes.io/default_route": "true"}
			},
			ops: []opPath{{"add", "/spec/template/metadata"}},
			want: `{"metadata":{"name":"a"},"spec":{"template":{"metadata":{"annotations":{"x.kubernetes.io/default_route":"true"}},
				"spec":{"domain":{"devices":{}}}}}}`,
		},
		"template absent: the nearest missing ancestor is added once": {
			raw: `{"metadata":{"name":"a"},"spec":{"runStrategy":"Halted"}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				vm.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{}
				vm.Spec.Template.Spec.Networks = []kubevirtv1.Network{{Name: "n", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "br"}}}}
				vm.Spec.Template.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "n"}}
			},
			ops: []opPath{{"add", "/spec/template"}},
			want: `{"metadata":{"name":"a"},"spec":{"runStrategy":"Halted","template":{"metadata":{},
				"spec":{"domain":{"devices":{"interfaces":[{"name":"n"}]},"resources":{}},"networks":[{"name":"n","multus":{"networkName":"br"}}]}}}}`,
		},
		"null parent in raw counts as missing": {
			raw: `{"metadata":{"name":"a","annotations":null},"spec":{}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				vm.Annotations = map[string]string{"kvnet.io/mutations": "[]"}
			},
			ops:  []opPath{{"add", "/metadata/annotations"}},
			want: `{"metadata":{"name":"a","annotations":{"kvnet.io/mutations":"[]"}},"spec":{}}`,
		},
		"annotation keys with / and ~ are escaped": {
			raw: `{"metadata":{"name":"a","annotations":{"a/b":"1"}},"spec":{}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				vm.Annotations["kvnet.io/mutations"] = "[]"
				vm.Annotations["odd~key/x"] = "y"
			},
			ops:  []opPath{{"add", "/metadata/annotations/kvnet.io~1mutations"}, {"add", "/metadata/annotations/odd~0key~1x"}},
			want: `{"metadata":{"name":"a","annotations":{"a/b":"1","kvnet.io/mutations":"[]","odd~key/x":"y"}},"spec":{}}`,
		},
		"lifted path with / in a key is escaped": {
			raw: `{"metadata":{"name":"a"},"spec":{"template":{"spec":{}}}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				vm.Spec.Template.ObjectMeta.Annotations = map[string]string{"p.kubernetes.io/allow_live_migration": "true"}
				vm.Annotations = map[string]string{"kvnet.io/mutations": "[]"}
			},
			ops: []opPath{{"add", "/metadata/annotations"}, {"add", "/spec/template/metadata"}},
			want: `{"metadata":{"name":"a","annotations":{"kvnet.io/mutations":"[]"}},"spec":{"template":{
				"metadata":{"annotations":{"p.kubernetes.io/allow_live_migration":"true"}},"spec":{}}}}`,
		},
		"unknown fields everywhere survive; only known changes are patched": {
			raw: `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"},
				"spec":{"futureTopLevel":{"x":1},"template":{"metadata":{"labels":{"a":"b"}},"spec":{
				"futureSpecField":true,
				"domain":{"devices":{"someFutureField":{"y":[1,2]},"interfaces":[{"name":"default","masquerade":{},"futureIfaceField":"keep"}]},
				"resources":{"requests":{"memory":"1Gi"}}},
				"networks":[{"name":"default","pod":{},"futureNet":1}]}}},"status":{"futureStatus":"z"}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				s := &vm.Spec.Template.Spec
				s.Networks = append(s.Networks, kubevirtv1.Network{Name: "n", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "br"}}})
				s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, kubevirtv1.Interface{Name: "n", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}}})
				s.Domain.Devices.NetworkInterfaceMultiQueue = ptr.To(true)
				s.Domain.Memory = &kubevirtv1.Memory{ReservedOverhead: &kubevirtv1.ReservedOverhead{MemLock: ptr.To(kubevirtv1.MemLockRequirement(kubevirtv1.MemLockRequired))}}
			},
			ops: []opPath{
				{"add", "/spec/template/spec/domain/devices/networkInterfaceMultiqueue"},
				{"add", "/spec/template/spec/domain/devices/interfaces/1"},
				{"add", "/spec/template/spec/domain/memory"},
				{"add", "/spec/template/spec/networks/1"},
			},
			want: `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a"},
				"spec":{"futureTopLevel":{"x":1},"template":{"metadata":{"labels":{"a":"b"}},"spec":{
				"futureSpecField":true,
				"domain":{"devices":{"someFutureField":{"y":[1,2]},"networkInterfaceMultiqueue":true,
				"interfaces":[{"name":"default","masquerade":{},"futureIfaceField":"keep"},{"name":"n","bridge":{}}]},
				"memory":{"reservedOverhead":{"memLock":"Required"}},
				"resources":{"requests":{"memory":"1Gi"}}},
				"networks":[{"name":"default","pod":{},"futureNet":1},{"name":"n","multus":{"networkName":"br"}}]}}},"status":{"futureStatus":"z"}}`,
		},
		"a remove of a member raw lacks is dropped": {
			raw: `{"metadata":{"name":"a"},"spec":{}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				vm.Annotations = nil // before had annotations raw does not
			},
			want: `{"metadata":{"name":"a"},"spec":{}}`,
		},
		"a remove under a parent raw lacks is dropped": {
			raw: `{"metadata":{"name":"a"},"spec":{}}`,
			mutate: func(vm *kubevirtv1.VirtualMachine) {
				vm.Spec.Template.ObjectMeta.Labels = nil
			},
			want: `{"metadata":{"name":"a"},"spec":{}}`,
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var vm kubevirtv1.VirtualMachine
			if err := json.Unmarshal([]byte(c.raw), &vm); err != nil {
				t.Fatal(err)
			}
			// What decoding may fill in that raw lacks.
			switch name {
			case "a remove of a member raw lacks is dropped":
				vm.Annotations = map[string]string{"x": "1"}
			case "a remove under a parent raw lacks is dropped":
				vm.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{}
				vm.Spec.Template.ObjectMeta.Labels = map[string]string{"x": "1"}
			}
			before, _ := json.Marshal(&vm)
			c.mutate(&vm)
			after, _ := json.Marshal(&vm)
			ops, err := patch.Compute([]byte(c.raw), before, after)
			if err != nil {
				t.Fatalf("Compute: %v", err)
			}
			for _, o := range ops {
				if o.Operation == "remove" {
					t.Errorf("remove op %s: nothing may be removed from raw", o.Path)
				}
			}
			if got := opPaths(ops); !sameOps(got, c.ops) {
				t.Errorf("ops = %v\nwant %v", got, c.ops)
			}
			if got, want := apply(t, c.raw, ops), jsonValue(t, c.want); !reflect.DeepEqual(got, want) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(want)
				t.Errorf("patched object\n got %s\nwant %s", g, w)
			}
		})
	}
}

// Compute reports, not panics on, a raw object that is not JSON where it
// must descend.
func TestComputeBadRaw(t *testing.T) {
	before := []byte(`{"a":{"b":1}}`)
	after := []byte(`{"a":{"b":2}}`)
	if _, err := patch.Compute([]byte(`{"a":{"b":`), before, after); err == nil {
		t.Fatal("want an error for a truncated raw object")
	}
}
