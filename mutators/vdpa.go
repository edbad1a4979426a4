package mutators

import (
	"context"
	"fmt"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// VDPA turns an interface on a vDPA NAD into what KubeVirt needs to run it:
// KubeVirt has no vDPA field, so vDPA is a binding plugin that reads the
// device path from device-info, plus locked guest memory (the device DMAs
// into it) and multiqueue so the queues scale with vCPUs. Fields the user set
// are left alone; the validator refuses the combinations that cannot work.
//
// memLock is set only when the KubeVirt CR enables the ReservedOverheadMemlock
// feature gate (or no CR is visible): virt-api refuses memLock otherwise, and
// its refusal says nothing about vDPA. The vdpa validator then refuses the VM
// with a message that names the gate to enable.
type VDPA struct{}

// Name implements chain.VMMutator.
func (VDPA) Name() string { return "vdpa" }

// Mutate implements chain.VMMutator.
func (m VDPA) Mutate(ctx context.Context, req *chain.Request) error {
	plugin := req.Config.VDPA.BindingPlugin
	memLock, gateRead := false, false
	for _, net := range req.Spec.Networks {
		if net.Multus == nil {
			continue
		}
		info, err := req.NAD(ctx, net.Multus.NetworkName)
		if err != nil {
			return err
		}
		if info == nil || req.Classify(info) != netattach.KindVDPA {
			continue
		}
		_, iface := req.Interface(net.Name)
		if iface == nil {
			continue
		}
		changed := false
		if !hasBinding(iface) {
			iface.Binding = &kubevirtv1.PluginBinding{Name: plugin}
			changed = true
		}
		if iface.Binding == nil {
			continue // bridge/sriov/... on vDPA: refused by the validator, not rewritten
		}
		if !gateRead {
			kv, err := req.Facts.KubeVirt(ctx)
			if err != nil {
				return fmt.Errorf("reading the KubeVirt CR for its feature gates: %w", err)
			}
			memLock, gateRead = lookup.FeatureGate(kv, lookup.MemLockFeatureGate), true
		}
		if memLock {
			changed = lockMemory(req.Spec) || changed
		}
		if req.Spec.Domain.Devices.NetworkInterfaceMultiQueue == nil {
			t := true
			req.Spec.Domain.Devices.NetworkInterfaceMultiQueue = &t
			changed = true
		}
		if changed {
			req.Record(m.Name(), "", net.Name)
		}
	}
	return nil
}

// lockMemory sets memLock: Required unless the user chose a value.
func lockMemory(spec *kubevirtv1.VirtualMachineInstanceSpec) bool {
	if spec.Domain.Memory == nil {
		// The common case, a VM saying nothing of its memory's overhead:
		// the three parts in one allocation.
		m := &struct {
			memory   kubevirtv1.Memory
			overhead kubevirtv1.ReservedOverhead
			lock     kubevirtv1.MemLockRequirement
		}{lock: kubevirtv1.MemLockRequired}
		m.overhead.MemLock = &m.lock
		m.memory.ReservedOverhead = &m.overhead
		spec.Domain.Memory = &m.memory
		return true
	}
	if spec.Domain.Memory.ReservedOverhead == nil {
		spec.Domain.Memory.ReservedOverhead = &kubevirtv1.ReservedOverhead{}
	}
	if spec.Domain.Memory.ReservedOverhead.MemLock != nil {
		return false
	}
	req := kubevirtv1.MemLockRequirement(kubevirtv1.MemLockRequired)
	spec.Domain.Memory.ReservedOverhead.MemLock = &req
	return true
}
