package app

import (
	"slices"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/validators"
	"github.com/kvnet/kvnet/webhook"
)

// Extensions are the pod mutators the optional capabilities contribute when
// they are set up: persistent IPs on launcher pods, migration addresses and
// the proxy sidecar on migration pods.
type Extensions struct {
	LauncherPod  []chain.PodMutator
	MigrationPod []chain.PodMutator
}

// Chains lists what kvnet runs behind each webhook path, in order; `kvnet
// webhook` and `kvnet mutate` both take it from here.
//
// VM mutators: networks are injected before the steps that specialise
// interfaces by the NAD they attach. Validators check what the mutators
// left, and report every error they find. On launcher pods NetworkResources
// runs last: it reads the Multus annotations as the others leave them.
// VirtualMachineInstanceMigrations have validators of their own.
func Chains(ext Extensions) webhook.Chains {
	return webhook.Chains{
		VM: []chain.VMMutator{mutators.NetworkInjector{}, mutators.Addresses{}, mutators.VDPA{}, mutators.KubeOVN{}},
		VMValidators: []chain.VMValidator{
			validators.Topology{}, validators.NADs{}, validators.Binding{}, validators.Plugins{}, validators.DefaultRoute{},
			validators.VDPACheck{}, validators.PersistentIPs{}, validators.PrimaryUDNCheck{}, validators.AddressesCheck{},
		},
		LauncherPod: slices.Concat(
			[]chain.PodMutator{mutators.KubeOVNPod{}, mutators.AddressesPod{}},
			ext.LauncherPod,
			[]chain.PodMutator{mutators.NetworkResources{}}),
		MigrationPod: ext.MigrationPod,
		// Decentralized migrations: a migration ID is refused while another
		// live VMIM of its role holds it.
		MigrationValidators: []chain.MigrationValidator{validators.MigrationIDs{}, validators.MigrationRoutes{}},
	}
}
