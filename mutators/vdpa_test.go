package mutators_test

import (
	"context"
	"reflect"
	"testing"

	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/mutators"
)

func TestVDPA(t *testing.T) {
	required := kubevirtv1.MemLockRequirement(kubevirtv1.MemLockRequired)
	notRequired := kubevirtv1.MemLockRequirement(kubevirtv1.MemLockNotRequired)
	cases := map[string]struct {
		iface      string // the interface line of the VM, for network "dp"
		nad        string
		domain     string // extra domain fields
		wantIfaces []string
		wantLock   *kubevirtv1.MemLockRequirement
		wantMQ     *bool
		wantRecord []chain.Change
		kubevirt   *kubevirtv1.KubeVirt // the cluster's KubeVirt CR; nil: none visible
	}{
		"KubeVirt without the memLock feature gate: no memLock (virt-api would refuse it)": {
			iface:      "{name: dp}",
			nad:        "vd",
			kubevirt:   &kubevirtv1.KubeVirt{},
			wantIfaces: []string{"dp:plugin:jaguar"},
			wantMQ:     ptr.To(true),
			wantRecord: []chain.Change{{Mutator: "vdpa", Networks: []string{"dp"}}},
		},
		"KubeVirt with the memLock feature gate: memLock": {
			iface: "{name: dp}",
			nad:   "vd",
			kubevirt: &kubevirtv1.KubeVirt{Spec: kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{
				DeveloperConfiguration: &kubevirtv1.DeveloperConfiguration{FeatureGates: []string{lookup.MemLockFeatureGate}},
			}}},
			wantIfaces: []string{"dp:plugin:jaguar"},
			wantLock:   &required,
			wantMQ:     ptr.To(true),
			wantRecord: []chain.Change{{Mutator: "vdpa", Networks: []string{"dp"}}},
		},
		"interface without binding gets the plugin, memLock and multiqueue": {
			iface:      "{name: dp}",
			nad:        "vd",
			wantIfaces: []string{"dp:plugin:jaguar"},
			wantLock:   &required,
			wantMQ:     ptr.To(true),
			wantRecord: []chain.Change{{Mutator: "vdpa", Networks: []string{"dp"}}},
		},
		"user memLock and multiqueue are not overridden": {
			iface:      "{name: dp}",
			nad:        "tenant-a/vd",
			domain:     "memory: {reservedOverhead: {memLock: NotRequired}}\n        devices: {networkInterfaceMultiqueue: false, interfaces: [{name: dp}]}",
			wantIfaces: []string{"dp:plugin:jaguar"},
			wantLock:   &notRequired,
			wantMQ:     ptr.To(false),
			wantRecord: []chain.Change{{Mutator: "vdpa", Networks: []string{"dp"}}},
		},
		"a user plugin binding is kept; memory is still locked": {
			iface:      "{name: dp, binding: {name: other-vdpa}}",
			nad:        "vd",
			wantIfaces: []string{"dp:plugin:other-vdpa"},
			wantLock:   &required,
			wantMQ:     ptr.To(true),
			wantRecord: []chain.Change{{Mutator: "vdpa", Networks: []string{"dp"}}},
		},
		"everything set already: no change recorded": {
			iface:      "{name: dp, binding: {name: jaguar}}",
			nad:        "vd",
			domain:     "memory: {reservedOverhead: {memLock: Required}}\n        devices: {networkInterfaceMultiqueue: true, interfaces: [{name: dp, binding: {name: jaguar}}]}",
			wantIfaces: []string{"dp:plugin:jaguar"},
			wantLock:   &required,
			wantMQ:     ptr.To(true),
		},
		"bridge on a vDPA NAD is left for the validator": {
			iface:      "{name: dp, bridge: {}}",
			nad:        "vd",
			wantIfaces: []string{"dp:bridge"},
		},
		"SR-IOV NAD is not vDPA": {
			iface:      "{name: dp}",
			nad:        "vf",
			wantIfaces: []string{"dp:none"},
		},
		"missing NAD is skipped": {
			iface:      "{name: dp}",
			nad:        "gone",
			wantIfaces: []string{"dp:none"},
		},
		"malformed NAD reference is left for the validator, not a kvnet failure": {
			iface:      "{name: dp}",
			nad:        "Not_A/valid/ref",
			wantIfaces: []string{"dp:none"},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			domain := c.domain
			if domain == "" {
				domain = "devices: {interfaces: [" + c.iface + "]}"
			}
			_, req := vmRequest(t, `
metadata: {name: vm1}
spec:
  template:
    spec:
      domain:
        `+domain+`
      networks: [{name: dp, multus: {networkName: "`+c.nad+`"}}]
`, mustConfig(t, "vdpa: {bindingPlugin: jaguar}"))
			req.Facts.(*lookup.Snapshot).KubeVirtCR = c.kubevirt
			if err := (mutators.VDPA{}).Mutate(context.Background(), req); err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			_, ifaces := netSummary(req.Spec)
			if !reflect.DeepEqual(ifaces, c.wantIfaces) {
				t.Errorf("interfaces = %v, want %v", ifaces, c.wantIfaces)
			}
			var lock *kubevirtv1.MemLockRequirement
			if m := req.Spec.Domain.Memory; m != nil && m.ReservedOverhead != nil {
				lock = m.ReservedOverhead.MemLock
			}
			if !reflect.DeepEqual(lock, c.wantLock) {
				t.Errorf("memLock = %v, want %v", ptr.Deref(lock, "<nil>"), ptr.Deref(c.wantLock, "<nil>"))
			}
			if mq := req.Spec.Domain.Devices.NetworkInterfaceMultiQueue; !reflect.DeepEqual(mq, c.wantMQ) {
				t.Errorf("multiqueue = %v, want %v", mq, c.wantMQ)
			}
			if !reflect.DeepEqual(req.Changes, c.wantRecord) {
				t.Errorf("changes = %+v, want %+v", req.Changes, c.wantRecord)
			}
		})
	}
}

// An interface missing for a vDPA network, or a pod network, is not vDPA's
// business; a VM without any vDPA network gets no memory section.
func TestVDPALeavesOtherVMsAlone(t *testing.T) {
	_, req := vmRequest(t, `
metadata: {name: vm1}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: default, masquerade: {}}]}}
      networks: [{name: default, pod: {}}, {name: dp, multus: {networkName: vd}}]
`, mustConfig(t, "{}"))
	if err := (mutators.VDPA{}).Mutate(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if req.Spec.Domain.Memory != nil || req.Spec.Domain.Devices.NetworkInterfaceMultiQueue != nil || len(req.Changes) != 0 {
		t.Fatalf("spec changed: memory=%+v mq=%v changes=%+v", req.Spec.Domain.Memory, req.Spec.Domain.Devices.NetworkInterfaceMultiQueue, req.Changes)
	}
}
