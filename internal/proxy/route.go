package proxy

import (
	"errors"
	"fmt"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// A migration ID is chosen by whoever orchestrates the migration and may
// be guessed or copied: it names a migration, it does not prove whose it
// is. What the hop carries, a stream or a network identity, is therefore
// tied to the VM it belongs to by namespace and name:
//
//   - the source proxy says which VM sends (the sending VMIM's namespace
//     and spec.vmiName) and which VM it means to receive (by default the
//     same namespace and name; AnnotationMigrationTarget on the sending
//     VMIM, which only the source namespace's users can write, names
//     another);
//   - the target proxy looks for the receiving VMIM of that ID in the
//     declared namespace only, for the declared VM only, and, when the
//     sender is another namespace or VM, only if the receiving VMIM
//     approves that peer's VM (AnnotationMigrationSource, which only the
//     receiving namespace's users can write).
//
// Both halves are needed: a tenant of the target cluster who copies a
// victim's ID into its own namespace is never looked at (the victim's
// source names the victim's namespace), and a tenant of the source
// cluster who names the victim's VM as its target is refused (the
// victim's receiving VMIM approves no such sender).

// AnnotationMigrationTarget and AnnotationMigrationSource are
// migrationid's AnnotationTarget and AnnotationSource.
const (
	AnnotationMigrationTarget = migrationid.AnnotationTarget
	AnnotationMigrationSource = migrationid.AnnotationSource
)

// RouteOf is the route of the migration that vmim sends vmi on: vmi's
// namespace and name to the VM AnnotationMigrationTarget names, or to the
// same namespace and name.
func RouteOf(vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) (hop.Route, error) {
	if vmim == nil || vmim.Spec.SendTo == nil {
		return hop.Route{}, errors.New("not a sending VirtualMachineInstanceMigration")
	}
	rt := hop.SameVM(vmim.Spec.SendTo.MigrationID, vmi.Namespace, vmi.Name)
	if v, ok := vmim.Annotations[AnnotationMigrationTarget]; ok {
		target, err := hop.ParseVMRef(v)
		if err != nil {
			return hop.Route{}, fmt.Errorf("metadata.annotations[%s]: %w", AnnotationMigrationTarget, err)
		}
		rt.Target = target
	}
	if err := rt.Validate(); err != nil {
		return hop.Route{}, fmt.Errorf("the migration's route: %w", err)
	}
	return rt, nil
}

// Approval is the value of AnnotationMigrationSource that lets peer's VM
// source send to a receiving VMIM of another namespace or name.
func Approval(peer string, source hop.VMRef) string { return peer + "/" + source.String() }

// approves reports whether the receiving VMIM m takes route rt from peer:
// it receives rt's target VM, and the sender is that VM or one it names.
func approves(m *kubevirtv1.VirtualMachineInstanceMigration, peer string, rt hop.Route) error {
	if m.Namespace != rt.Target.Namespace || m.Spec.VMIName != rt.Target.Name {
		return fmt.Errorf("receiving VMIM %s/%s receives VMI %s/%s, not %s", m.Namespace, m.Name, m.Namespace, m.Spec.VMIName, rt.Target)
	}
	if rt.Source == rt.Target {
		return nil
	}
	if got := m.Annotations[AnnotationMigrationSource]; got != Approval(peer, rt.Source) {
		return fmt.Errorf("receiving VMIM %s/%s does not approve VM %s of peer %s as its sender (annotation %s is %q)",
			m.Namespace, m.Name, rt.Source, peer, AnnotationMigrationSource, got)
	}
	return nil
}
