package proxy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
)

// Remote is what a migration's relays are built from: the migration and the
// truthful remote endpoint. Two equal Remotes need the same relays.
type Remote struct {
	MigrationID string
	// Receiver is the VM in the peer cluster that is to receive the
	// migration (RouteOf).
	Receiver hop.VMRef
	Target   string
	// Ports is targetState.directMigrationNodePorts: remote port -> libvirt
	// port (0, 49152, 49153).
	Ports map[string]int
}

// Same reports whether r and o need the same relays.
func (r Remote) Same(o Remote) bool {
	return r.MigrationID == o.MigrationID && r.Receiver == o.Receiver && r.Target == o.Target && maps.Equal(r.Ports, o.Ports)
}

// Matches reports whether m was published for exactly this remote endpoint:
// same migration, same target and a local port for each remote port, no more.
func (r Remote) Matches(m store.Mapping) bool {
	if m.MigrationID != r.MigrationID || m.Target != r.Target || m.Address == "" || len(m.Ports) != len(r.Ports) {
		return false
	}
	seen := make(map[string]bool, len(m.Ports))
	for k := range r.Ports {
		local := m.Ports[k]
		if local == "" || seen[local] {
			return false // a hand-edited or corrupt mapping never reaches virt-handler
		}
		seen[local] = true
	}
	return true
}

// RemoteOf returns the remote endpoint of vmi's migration with the given
// source VMIM, or false while the target has not reported one yet.
func RemoteOf(vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) (Remote, bool) {
	ms := vmi.Status.MigrationState
	if vmim == nil || vmim.Spec.SendTo == nil || ms == nil || ms.TargetState == nil {
		return Remote{}, false
	}
	ts := ms.TargetState
	if ts.NodeAddress == nil || *ts.NodeAddress == "" || len(ts.DirectMigrationNodePorts) == 0 {
		return Remote{}, false
	}
	return Remote{MigrationID: vmim.Spec.SendTo.MigrationID, Target: *ts.NodeAddress, Ports: maps.Clone(ts.DirectMigrationNodePorts)}, true
}

// SourceMigration finds the in-flight VMIM that makes vmi the source of a
// decentralized migration: same namespace, spec.vmiName = vmi, spec.sendTo
// set, not yet Succeeded or Failed. When several qualify, the one the VMI's
// status names (migrationState.migrationUid) wins, then the newest. nil
// means vmi is not such a source (a local migration, or a target VMI, whose
// fields kvnet must not touch).
func SourceMigration(ctx context.Context, r client.Reader, vmi *kubevirtv1.VirtualMachineInstance) (*kubevirtv1.VirtualMachineInstanceMigration, error) {
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := r.List(ctx, &list, client.InNamespace(vmi.Namespace)); err != nil {
		return nil, fmt.Errorf("listing VirtualMachineInstanceMigrations in %s: %w", vmi.Namespace, err)
	}
	var cands []*kubevirtv1.VirtualMachineInstanceMigration
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.VMIName == vmi.Name && m.Spec.SendTo != nil && m.Spec.Receive == nil && !m.IsFinal() && m.DeletionTimestamp == nil {
			cands = append(cands, m)
		}
	}
	if len(cands) == 0 {
		return nil, nil
	}
	if ms := vmi.Status.MigrationState; ms != nil && ms.MigrationUID != "" {
		for _, m := range cands {
			if m.UID == ms.MigrationUID {
				return m, nil
			}
		}
	}
	slices.SortFunc(cands, func(a, b *kubevirtv1.VirtualMachineInstanceMigration) int {
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	return cands[0], nil
}

// Rewrite returns the top-level status.migrationState.targetNodeAddress and
// targetDirectMigrationNodePorts the source virt-handler must see: the
// proxy's address and local ports (libvirt port values kept) when the
// published mapping matches the current remote endpoint, otherwise empty
// values, which make virt-handler wait. It is a pure function of its inputs,
// so the synchronization controller's repeated copies of the truthful values
// always turn into the same stored values.
func Rewrite(remote Remote, annotation string) (address string, ports map[string]int) {
	if annotation == "" {
		return "", nil
	}
	m, err := store.DecodeMapping(annotation)
	if err != nil || !remote.Matches(m) {
		return "", nil
	}
	ports = make(map[string]int, len(remote.Ports))
	for remotePort, libvirtPort := range remote.Ports {
		ports[m.Ports[remotePort]] = libvirtPort
	}
	return m.Address, ports
}

// MaxMigrationPorts is how many ports KubeVirt's target virt-handler opens
// for one migration: the migration itself (libvirt port 0) and, for block
// migration, 49152 and 49153. A status that announces more is not
// KubeVirt's, and each announced port costs a relay listener.
const MaxMigrationPorts = 3

// CheckMigrationPorts checks targetState.directMigrationNodePorts as the
// target virt-handler writes it: at most MaxMigrationPorts node ports, each
// a TCP port, each leading to one of the libvirt ports KubeVirt proxies
// (0, 49152, 49153), none twice. The VMI's status is writable by whoever
// may create the VMI, so the proxy opens and dials nothing beyond this.
func CheckMigrationPorts(ports map[string]int) error {
	const path = "status.migrationState.targetState.directMigrationNodePorts"
	if len(ports) > MaxMigrationPorts {
		return fmt.Errorf("%s: %d ports, at most %d (what KubeVirt opens for one migration)", path, len(ports), MaxMigrationPorts)
	}
	seen := map[int]bool{}
	for k, v := range ports {
		if p, err := strconv.ParseUint(k, 10, 16); err != nil || p == 0 {
			return fmt.Errorf("%s: key %q is not a TCP port", path, k)
		}
		if v != 0 && v != 49152 && v != 49153 {
			return fmt.Errorf("%s[%q]: %d is not a port KubeVirt migrates through (0, 49152 or 49153)", path, k, v)
		}
		if seen[v] {
			return fmt.Errorf("%s: two node ports lead to %d", path, v)
		}
		seen[v] = true
	}
	return nil
}
