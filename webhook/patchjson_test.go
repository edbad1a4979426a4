package webhook

import (
	"bytes"
	"cmp"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	jsonpatch "gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// encodingJSONs is the patch as encoding/json writes it.
func encodingJSONs(t *testing.T, ops []jsonpatch.Operation) []byte {
	t.Helper()
	plain := make([]patchOp, len(ops))
	for i, op := range ops {
		plain[i] = patchOp{Op: op.Operation, Path: op.Path, Value: op.Value}
	}
	want, err := json.Marshal(plain)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

// appendOps writes every value a VM mutation makes as encoding/json does,
// and declines what it does not write (a field it leaves to reflection).
func TestAppendOpsIsEncodingJSONs(t *testing.T) {
	memLock := &kubevirtv1.Memory{ReservedOverhead: &kubevirtv1.ReservedOverhead{MemLock: ptr.To(kubevirtv1.MemLockRequirement(kubevirtv1.MemLockRequired))}}
	networks := []kubevirtv1.Network{
		{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
		{Name: "pod6", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{VMNetworkCIDR: "10.0.0.0/24", VMIPv6NetworkCIDR: "fd10::/64"}}},
		{Name: "ovn", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "tenant-a/ovn", Default: true}}},
		{Name: "none"},
	}
	ifaces := []kubevirtv1.Interface{
		{Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}}},
		{Name: "dp", Binding: &kubevirtv1.PluginBinding{Name: "vdpa"}, MacAddress: "02:00:00:00:00:01", BootOrder: ptr.To(uint(2)), ACPIIndex: 3, Model: "virtio", PciAddress: "0000:81:00.1", Tag: "<db>", State: kubevirtv1.InterfaceStateLinkDown},
		{Name: "all", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}, SRIOV: &kubevirtv1.InterfaceSRIOV{},
			DeprecatedSlirp: &kubevirtv1.DeprecatedInterfaceSlirp{}, DeprecatedMacvtap: &kubevirtv1.DeprecatedInterfaceMacvtap{},
			DeprecatedPasst: &kubevirtv1.DeprecatedInterfacePasst{}, PasstBinding: &kubevirtv1.InterfacePasstBinding{}}},
	}
	written := [][]jsonpatch.Operation{
		{
			{Operation: "add", Path: "/metadata/annotations/kvnet.io~1mutations", Value: `[{"mutator":"kube-ovn"}] <= v1.12 & "more" ` + "\u2028 bad \xff"},
			{Operation: "add", Path: "/spec/template/metadata/annotations", Value: map[string]string{"z": "1", "a": "<2>", "m": ""}},
			{Operation: "replace", Path: "/spec/template/spec/networks", Value: &networks},
			{Operation: "add", Path: "/spec/template/spec/domain/devices/interfaces", Value: ifaces},
			{Operation: "add", Path: "/spec/template/spec/domain/devices/interfaces/-", Value: &ifaces[1]},
			{Operation: "add", Path: "/spec/template/spec/networks/-", Value: &networks[2]},
			{Operation: "replace", Path: "/spec/template/spec/domain/devices/networkInterfaceMultiqueue", Value: false},
			{Operation: "add", Path: "/spec/template/spec/domain/devices/networkInterfaceMultiqueue", Value: ptr.To(true)},
			{Operation: "add", Path: "/spec/template/spec/domain/memory", Value: memLock},
			{Operation: "remove", Path: "/spec/template/spec/domain/devices/interfaces/1"},
		},
		// What Nested builds where the object lacks a parent.
		{{Operation: "add", Path: "/spec/template", Value: map[string]any{
			"metadata": map[string]any{"annotations": map[string]string{"b": "1", "a": "2"}},
			"spec":     map[string]any{"networks": networks, "domain": map[string]any{"devices": map[string]any{"interfaces": ifaces}, "memory": memLock}},
		}}},
		{{Operation: "add", Path: "/a", Value: []kubevirtv1.Network(nil)}, {Operation: "add", Path: "/b", Value: (*kubevirtv1.Interface)(nil)}, {Operation: "add", Path: "/c", Value: map[string]string(nil)}},
	}
	for i, ops := range written {
		got, ok := appendOps(nil, ops)
		if want := encodingJSONs(t, ops); !ok || !bytes.Equal(got, want) {
			t.Errorf("patch %d: written %v\n got %s\nwant %s", i, ok, got, want)
		}
	}
	left := map[string]any{
		"ports":             &kubevirtv1.Interface{Name: "a", Ports: []kubevirtv1.Port{{Port: 80}}},
		"port ranges":       []kubevirtv1.Interface{{Name: "a", PortRanges: []kubevirtv1.PortRange{{Start: 80, End: 90}}}},
		"dhcp options":      &kubevirtv1.Interface{Name: "a", DHCPOptions: &kubevirtv1.DHCPOptions{BootFileName: "x"}},
		"a resource claim":  &[]kubevirtv1.Network{{Name: "a", NetworkSource: kubevirtv1.NetworkSource{ResourceClaim: &kubevirtv1.ClaimRequest{}}}},
		"a guest size":      &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("8Gi"))},
		"an added overhead": &kubevirtv1.Memory{ReservedOverhead: &kubevirtv1.ReservedOverhead{AddedOverhead: ptr.To(resource.MustParse("1Gi"))}},
		"a diff's value":    map[string]any{"x": float64(1)},
		"a list of any":     []any{"a"},
	}
	for what, v := range left {
		if got, ok := appendOps(nil, []jsonpatch.Operation{{Operation: "add", Path: "/x", Value: v}}); ok {
			t.Errorf("%s: written by hand as %s; reflection must write it", what, got)
		}
	}
}

// Networks and interfaces of random shapes, with text that needs escaping
// or is not UTF-8: whatever appendOps writes is encoding/json's bytes.
func TestAppendOpsRandomShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(50, 50))
	texts := []string{"", "a", "tenant-a/ovn", "<&>", "\u2028", "é", "\xff", `"q"\`}
	text := func() string { return texts[r.IntN(len(texts))] }
	maybe := func() bool { return r.IntN(2) == 0 }
	written := 0
	for range 2000 {
		n := kubevirtv1.Network{Name: text()}
		switch r.IntN(4) {
		case 0:
			n.Pod = &kubevirtv1.PodNetwork{VMNetworkCIDR: text(), VMIPv6NetworkCIDR: text()}
		case 1:
			n.Multus = &kubevirtv1.MultusNetwork{NetworkName: text(), Default: maybe()}
		case 2:
			n.Pod, n.Multus = &kubevirtv1.PodNetwork{}, &kubevirtv1.MultusNetwork{}
		}
		i := kubevirtv1.Interface{Name: text(), Model: text(), MacAddress: text(), PciAddress: text(), Tag: text(), State: kubevirtv1.InterfaceState(text())}
		m := &i.InterfaceBindingMethod
		for _, p := range []func(){
			func() { m.Bridge = &kubevirtv1.InterfaceBridge{} }, func() { m.Masquerade = &kubevirtv1.InterfaceMasquerade{} },
			func() { m.SRIOV = &kubevirtv1.InterfaceSRIOV{} }, func() { m.PasstBinding = &kubevirtv1.InterfacePasstBinding{} },
			func() { i.Binding = &kubevirtv1.PluginBinding{Name: text()} }, func() { i.BootOrder = ptr.To(uint(r.IntN(5))) },
			func() { i.ACPIIndex = r.IntN(5) - 2 },
		} {
			if maybe() {
				p()
			}
		}
		if r.IntN(10) == 0 {
			i.Ports = []kubevirtv1.Port{{Port: 80}}
		}
		ops := []jsonpatch.Operation{
			{Operation: "add", Path: "/n/-", Value: &n},
			{Operation: "add", Path: "/i/-", Value: &i},
			{Operation: "add", Path: "/m", Value: map[string]string{text(): text(), text(): text()}},
		}
		want := encodingJSONs(t, ops)
		got, ok := appendOps(nil, ops)
		if ok {
			written++
			if !bytes.Equal(got, want) {
				t.Fatalf("%+v %+v\n got %s\nwant %s", n, i, got, want)
			}
		} else if i.Ports == nil {
			t.Fatalf("%+v %+v: not written by hand", n, i)
		}
	}
	if written < 1500 {
		t.Fatalf("only %d of 2000 patches written by hand", written)
	}
}

// The appenders write every field these KubeVirt types have, or decline
// the value where it is set. A KubeVirt that adds a field fails here until
// webhook/patchjson.go writes or declines it: until then, a patch would
// drop the field.
func TestHandEncodedTypesHaveTheFieldsWritten(t *testing.T) {
	known := map[reflect.Type]string{
		reflect.TypeFor[kubevirtv1.Network]():                    "name,inline",
		reflect.TypeFor[kubevirtv1.NetworkSource]():              "pod,multus,resourceClaim",
		reflect.TypeFor[kubevirtv1.PodNetwork]():                 "vmNetworkCIDR,vmIPv6NetworkCIDR",
		reflect.TypeFor[kubevirtv1.MultusNetwork]():              "networkName,default",
		reflect.TypeFor[kubevirtv1.Interface]():                  "name,model,inline,binding,ports,portRanges,macAddress,bootOrder,pciAddress,dhcpOptions,tag,acpiIndex,state",
		reflect.TypeFor[kubevirtv1.InterfaceBindingMethod]():     "bridge,slirp,masquerade,sriov,macvtap,passt,passtBinding",
		reflect.TypeFor[kubevirtv1.PluginBinding]():              "name",
		reflect.TypeFor[kubevirtv1.Memory]():                     "hugepages,guest,maxGuest,reservedOverhead",
		reflect.TypeFor[kubevirtv1.ReservedOverhead]():           "addedOverhead,memLock",
		reflect.TypeFor[kubevirtv1.InterfaceBridge]():            "",
		reflect.TypeFor[kubevirtv1.InterfaceMasquerade]():        "",
		reflect.TypeFor[kubevirtv1.InterfaceSRIOV]():             "",
		reflect.TypeFor[kubevirtv1.DeprecatedInterfaceSlirp]():   "",
		reflect.TypeFor[kubevirtv1.DeprecatedInterfaceMacvtap](): "",
		reflect.TypeFor[kubevirtv1.DeprecatedInterfacePasst]():   "",
		reflect.TypeFor[kubevirtv1.InterfacePasstBinding]():      "",
	}
	for typ, want := range known {
		var names []string
		for f := range typ.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			names = append(names, cmp.Or(name, "inline"))
		}
		if got := strings.Join(names, ","); got != want {
			t.Errorf("%s has fields %s; webhook/patchjson.go writes %s", typ, got, want)
		}
		for m := range typ.Methods() {
			if slices.Contains([]string{"MarshalJSON", "MarshalText"}, m.Name) {
				t.Errorf("%s has %s, which appendOps does not call", typ, m.Name)
			}
		}
		if reflect.PointerTo(typ).Implements(reflect.TypeFor[json.Marshaler]()) {
			t.Errorf("*%s implements json.Marshaler, which appendOps does not call", typ)
		}
	}
}

// FuzzAppendOpsAgree holds appendOps to encoding/json on any text in any
// string member of the values it writes by hand.
func FuzzAppendOpsAgree(f *testing.F) {
	f.Add("default", "tenant-a/ovn", "02:00:00:00:00:01", "virtio", "<db>&", uint8(0b1011), -1)
	f.Add("", "\xff\u2028", `"\`, "\x00\n", "é", uint8(0xff), 3)
	f.Fuzz(func(t *testing.T, name, nad, mac, model, text string, set uint8, acpi int) {
		n := kubevirtv1.Network{Name: name}
		if set&1 != 0 {
			n.Multus = &kubevirtv1.MultusNetwork{NetworkName: nad, Default: set&2 != 0}
		} else {
			n.Pod = &kubevirtv1.PodNetwork{VMNetworkCIDR: text, VMIPv6NetworkCIDR: nad}
		}
		i := kubevirtv1.Interface{Name: name, Model: model, MacAddress: mac, PciAddress: text, Tag: nad, State: kubevirtv1.InterfaceState(model), ACPIIndex: acpi}
		if set&4 != 0 {
			i.Binding = &kubevirtv1.PluginBinding{Name: text}
		}
		if set&8 != 0 {
			i.Bridge = &kubevirtv1.InterfaceBridge{}
		}
		if set&16 != 0 {
			i.BootOrder = ptr.To(uint(set))
		}
		ops := []jsonpatch.Operation{
			{Operation: "add", Path: "/n/" + name, Value: []kubevirtv1.Network{n}},
			{Operation: "replace", Path: "/i", Value: &[]kubevirtv1.Interface{i}},
			{Operation: "add", Path: "/m", Value: map[string]any{text: map[string]string{nad: mac, name: model}}},
			{Operation: "add", Path: "/s", Value: text},
		}
		got, ok := appendOps(nil, ops)
		if want := encodingJSONs(t, ops); !ok || !bytes.Equal(got, want) {
			t.Fatalf("written %v\n got %s\nwant %s", ok, got, want)
		}
	})
}
