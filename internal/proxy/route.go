package proxy

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/model/migrationid"
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

// VMRef is a VM by namespace and name; its VMI has the same name.
type VMRef struct {
	Namespace, Name string
}

func (v VMRef) String() string { return v.Namespace + "/" + v.Name }

// Route is whose a migration is on the hop: its ID, the VM that sends it
// and the VM the sending side means to receive it.
type Route struct {
	MigrationID string
	Source      VMRef
	Target      VMRef
}

// SameVM is the route of a migration that keeps its namespace and name.
func SameVM(migrationID, namespace, name string) Route {
	vm := VMRef{Namespace: namespace, Name: name}
	return Route{MigrationID: migrationID, Source: vm, Target: vm}
}

// Validate says what is wrong with r, naming the field.
func (r Route) Validate() error {
	if err := checkMigrationID(r.MigrationID); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		vm   VMRef
	}{{"source", r.Source}, {"target", r.Target}} {
		if errs := validation.IsDNS1123Label(f.vm.Namespace); len(errs) > 0 {
			return fmt.Errorf("%s.namespace %q: %s", f.name, f.vm.Namespace, strings.Join(errs, "; "))
		}
		if errs := validation.IsDNS1123Subdomain(f.vm.Name); len(errs) > 0 {
			return fmt.Errorf("%s.name %q: %s", f.name, f.vm.Name, strings.Join(errs, "; "))
		}
	}
	return nil
}

// appendRoute encodes r: per string (migration ID, source namespace and
// name, target namespace and name) a one-byte length and the bytes.
func appendRoute(b []byte, r Route) []byte {
	for _, s := range []string{r.MigrationID, r.Source.Namespace, r.Source.Name, r.Target.Namespace, r.Target.Name} {
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	return b
}

// readRoute reads what appendRoute wrote and validates it. Every length is
// one byte, so it never reads more than 5 x 256 bytes.
func readRoute(r io.Reader) (Route, error) {
	var fields [5]string
	var one [1]byte
	for i, what := range []string{"migration ID", "source namespace", "source name", "target namespace", "target name"} {
		if _, err := io.ReadFull(r, one[:]); err != nil {
			return Route{}, fmt.Errorf("%s length: %w", what, err)
		}
		b := make([]byte, one[0])
		if _, err := io.ReadFull(r, b); err != nil {
			return Route{}, fmt.Errorf("%s: %w", what, err)
		}
		fields[i] = string(b)
	}
	rt := Route{MigrationID: fields[0], Source: VMRef{fields[1], fields[2]}, Target: VMRef{fields[3], fields[4]}}
	return rt, rt.Validate()
}

// RouteOf is the route of the migration that vmim sends vmi on: vmi's
// namespace and name to the VM AnnotationMigrationTarget names, or to the
// same namespace and name.
func RouteOf(vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) (Route, error) {
	if vmim == nil || vmim.Spec.SendTo == nil {
		return Route{}, errors.New("not a sending VirtualMachineInstanceMigration")
	}
	rt := SameVM(vmim.Spec.SendTo.MigrationID, vmi.Namespace, vmi.Name)
	if v, ok := vmim.Annotations[AnnotationMigrationTarget]; ok {
		target, err := ParseVMRef(v)
		if err != nil {
			return Route{}, fmt.Errorf("metadata.annotations[%s]: %w", AnnotationMigrationTarget, err)
		}
		rt.Target = target
	}
	if err := rt.Validate(); err != nil {
		return Route{}, fmt.Errorf("the migration's route: %w", err)
	}
	return rt, nil
}

// ParseVMRef reads "<namespace>/<name>" (migrationid.ParseVM).
func ParseVMRef(s string) (VMRef, error) {
	ns, name, err := migrationid.ParseVM(s)
	return VMRef{Namespace: ns, Name: name}, err
}

// Approval is the value of AnnotationMigrationSource that lets peer's VM
// source send to a receiving VMIM of another namespace or name.
func Approval(peer string, source VMRef) string { return peer + "/" + source.String() }

// approves reports whether the receiving VMIM m takes route rt from peer:
// it receives rt's target VM, and the sender is that VM or one it names.
func approves(m *kubevirtv1.VirtualMachineInstanceMigration, peer string, rt Route) error {
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
