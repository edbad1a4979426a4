package webhook

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
)

// Each member of each kind, as chain.Kind's one table places it, is where
// a real object of that kind has it: marshalled from KubeVirt's own types
// with every member set, the pointer resolves, the decoder reports it
// present, and each region's typed field holds what the object has there.
// An object with none of them reports none but its metadata.
func TestKindMembersInRealObjects(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "db", Namespace: "tenant-a", Annotations: map[string]string{"a": "1"}, Labels: map[string]string{"l": "1"}}
	tmeta := metav1.ObjectMeta{Annotations: map[string]string{"ta": "2"}, Labels: map[string]string{"tl": "2"}}
	guest := resource.MustParse("2Gi")
	spec := kubevirtv1.VirtualMachineInstanceSpec{
		Domain: kubevirtv1.DomainSpec{
			Memory: &kubevirtv1.Memory{Guest: &guest},
			Devices: kubevirtv1.Devices{
				NetworkInterfaceMultiQueue: ptr.To(true),
				Interfaces:                 []kubevirtv1.Interface{{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}}},
			},
		},
		Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
	}
	objects := map[chain.Kind]any{
		chain.KindVM: &kubevirtv1.VirtualMachine{TypeMeta: metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine"}, ObjectMeta: meta,
			Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{ObjectMeta: tmeta, Spec: spec}}},
		chain.KindVMI: &kubevirtv1.VirtualMachineInstance{TypeMeta: metav1.TypeMeta{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance"}, ObjectMeta: meta, Spec: spec},
	}
	for kind, obj := range objects {
		raw, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		req, shape, err := decodeVMOrVMI(kind, raw, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := chain.MemberMeta; m <= chain.MemberMultiqueue; m++ {
			p := kind.Pointer(m)
			if p == "" {
				continue
			}
			n++
			if _, ok := resolve(doc, p); !ok {
				t.Errorf("%s: member %d at %s is not in a real object: %s", kind, m, p, raw)
			}
			if !shape.has(p) {
				t.Errorf("%s: the decoder does not report %s present", kind, p)
			}
		}
		if min := map[chain.Kind]int{chain.KindVM: 15, chain.KindVMI: 10}[kind]; n < min {
			t.Errorf("%s: %d members, want at least %d", kind, n, min)
		}
		rs := req.Regions()
		fields := map[string]any{rs.Networks.Pointer: *rs.Networks.Field, rs.Interfaces.Pointer: *rs.Interfaces.Field, rs.Multiqueue.Pointer: *rs.Multiqueue.Field, rs.Memory.Pointer: *rs.Memory.Field}
		for _, r := range rs.Maps {
			fields[r.Pointer] = *r.Field
		}
		if want := map[chain.Kind]int{chain.KindVM: 8, chain.KindVMI: 6}[kind]; len(fields) != want {
			t.Errorf("%s: %d regions, want %d", kind, len(fields), want)
		}
		for p, f := range fields {
			at, ok := resolve(doc, p)
			got, want := canonical(t, f), canonical(t, at)
			if !ok || string(got) != string(want) {
				t.Errorf("%s: region %s holds %s, the object has %s there", kind, p, got, want)
			}
		}

		bare, _ := json.Marshal(map[string]any{"metadata": map[string]string{"name": "db"}})
		_, empty, err := decodeVMOrVMI(kind, bare, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		for m := chain.MemberMeta; m <= chain.MemberMultiqueue; m++ {
			if p := kind.Pointer(m); p != "" && empty.has(p) != (p == "/metadata") {
				t.Errorf("%s: an object with only a name reports %s present: %v", kind, p, empty.has(p))
			}
		}
	}
}

// resolve follows a JSON pointer (without escapes) through decoded JSON.
func resolve(doc any, pointer string) (any, bool) {
	for _, key := range strings.Split(pointer, "/")[1:] {
		m, ok := doc.(map[string]any)
		if !ok {
			return nil, false
		}
		if doc, ok = m[key]; !ok {
			return nil, false
		}
	}
	return doc, true
}

// canonical is v's JSON with object keys in order.
func canonical(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var g any
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(g)
	return string(b)
}
