package app

import (
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/validators"
	"github.com/kvnet/kvnet/webhook"
)

// Capabilities are the steps the optional capabilities hand in once they
// are set up. A step left nil drops out of its chain: the capability is
// off (persistent IPs without the IPAMClaim CRD) or not run (the offline
// CLI has no cluster to allocate from).
type Capabilities struct {
	PersistentIPs PersistentIPSteps
	Migration     MigrationSteps
	// PeerWebhooks calls a peer's webhook where the API server does not
	// call it after kvnet (mutators.MACPool); nil calls none.
	PeerWebhooks mutators.WebhookCaller
}

// PersistentIPSteps are the launcher-pod steps of persistent IPs.
type PersistentIPSteps struct {
	ClaimRefs, ReceivedIdentity, PrimaryUDN chain.PodMutator
}

// MigrationSteps are the migration-pod steps of the migration networks.
type MigrationSteps struct {
	Addresses, Sidecar chain.PodMutator
}

// Chains lists every step kvnet runs behind each webhook path, in the
// order it runs them; `kvnet webhook` and `kvnet mutate` both take them
// from here.
func Chains(c Capabilities) webhook.Chains {
	return webhook.Chains{
		// Networks are injected before the steps that specialise
		// interfaces by the NAD they attach.
		VM: []chain.VMMutator{
			mutators.NetworkInjector{},
			mutators.Addresses{},
			mutators.VDPA{},
			mutators.KubeOVN{},
			// Last: it looks at the interfaces the others added.
			mutators.MACPool{Webhooks: c.PeerWebhooks},
		},
		// Validators check what the mutators left, and report every error
		// they find.
		VMValidators: []chain.VMValidator{
			validators.Topology{},
			validators.NADs{},
			validators.Binding{},
			validators.Plugins{},
			validators.DefaultRoute{},
			validators.VDPACheck{},
			validators.PersistentIPs{},
			validators.PrimaryUDNCheck{},
			validators.AddressesCheck{},
			validators.MACsHeld{},
		},
		LauncherPod: podSteps(
			mutators.KubeOVNPod{},
			mutators.AddressesPod{},
			c.PersistentIPs.ClaimRefs,
			// After ClaimRefs: it acts on the claim references ClaimRefs set.
			c.PersistentIPs.ReceivedIdentity,
			c.PersistentIPs.PrimaryUDN,
			// Last: it reads the Multus annotations as the others leave them.
			mutators.NetworkResources{},
		),
		MigrationPod: podSteps(
			// Addresses first: a pod refused for its address gets no
			// sidecar either.
			c.Migration.Addresses,
			c.Migration.Sidecar,
		),
		// Decentralized migrations: a migration ID is refused while another
		// live VMIM of its role holds it, and a route names who may use it.
		MigrationValidators: []chain.MigrationValidator{
			validators.MigrationIDs{},
			validators.MigrationRoutes{},
		},
	}
}

// persistentIPSteps are the persistent-IP steps reading VMIs and claims
// from cache and, for what the cache does not have yet, from api.
func persistentIPSteps(cache, api client.Reader) PersistentIPSteps {
	r := mutators.VMIReader{Cache: cache, API: api}
	return PersistentIPSteps{
		ClaimRefs:        mutators.ClaimRefs(r),
		ReceivedIdentity: mutators.ReceivedIdentity(r),
		PrimaryUDN:       mutators.PrimaryUDNPod(r),
	}
}

// migrationSteps are the migration-network steps around the allocator's
// mutator.
func migrationSteps(addresses *migration.AddressMutator) MigrationSteps {
	return MigrationSteps{Addresses: addresses, Sidecar: migration.Sidecar{}}
}

// podSteps is steps without the nil ones, in order.
func podSteps(steps ...chain.PodMutator) []chain.PodMutator {
	return slices.DeleteFunc(steps, func(s chain.PodMutator) bool { return s == nil })
}
