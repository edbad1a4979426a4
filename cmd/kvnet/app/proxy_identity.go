package app

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// identityReceiver is the hop's IdentityReceiver: persistentips.Receiver
// behind the proxy's types. The layout keeps the proxy and the claims
// apart (neither imports the other), so the two meet here.
type identityReceiver struct{ r *persistentips.Receiver }

// newIdentityReceiver reads claims and pods uncached (the checks must see
// the pod or claim that holds an address now, not what an informer last
// heard), NADs from the manager's cache (each pod's network-status entry
// asks for one: a tenant's pod must not make each identity cost an API
// read per entry), and records its outcome on the receive VMIM.
func newIdentityReceiver(mgr manager.Manager) identityReceiver {
	return identityReceiver{&persistentips.Receiver{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Facts: lookup.NewReader(mgr.GetClient()),
		Events: mgr.GetEventRecorder("kvnet-migration-proxy"),
		Log:    mgr.GetLogger().WithName("migration-proxy").WithName("identity"),
	}}
}

// ReceiveIdentity implements proxy.IdentityReceiver: a late identity is
// identity-after-target-pod, an address or MAC in use identity-held, any
// other mismatch identity-mismatch.
func (i identityReceiver) ReceiveIdentity(ctx context.Context, peer string, vmim types.NamespacedName, id hop.Identity) error {
	nets := make([]persistentips.ReceivedNetwork, 0, len(id.Networks))
	for _, n := range id.Networks {
		nets = append(nets, persistentips.ReceivedNetwork{Name: n.Name, NetworkName: n.NetworkName, MAC: n.MAC, IPs: n.IPs})
	}
	err := i.r.Receive(ctx, peer, vmim, nets)
	var m *persistentips.Mismatch
	if !errors.As(err, &m) {
		return err
	}
	reason := hop.RefusedIdentityMismatch
	switch m.Reason {
	case persistentips.ReasonLate:
		reason = hop.RefusedIdentityLate
	case persistentips.ReasonHeld:
		reason = hop.RefusedIdentityHeld // the holder may go: the source tries again
	}
	return &proxy.IdentityRefusal{Reason: reason, Err: m}
}

// identitySource is the source proxy's proxy.IdentitySource: the VM's
// claims, read uncached (the proxy caches no claims; one read per
// migration).
type identitySource struct{ r client.Reader }

// IdentityOf implements proxy.IdentitySource.
func (s identitySource) IdentityOf(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) ([]hop.NetworkIdentity, error) {
	nets, err := persistentips.SourceNetworks(ctx, s.r, vmi)
	if err != nil {
		return nil, err
	}
	out := make([]hop.NetworkIdentity, 0, len(nets))
	for _, n := range nets {
		out = append(out, hop.NetworkIdentity{Name: n.Name, NetworkName: n.NetworkName, MAC: n.MAC, IPs: n.IPs})
	}
	return out, nil
}

// leaseMarker is the source proxy's proxy.LeaseMarker: the VM's claims,
// listed uncached (once per move) and patched.
type leaseMarker struct {
	r client.Reader
	c client.Client
}

// MarkLeases implements proxy.LeaseMarker.
func (l leaseMarker) MarkLeases(ctx context.Context, namespace, vm, peer string, route hop.Route) (int, error) {
	return persistentips.MarkLeases(ctx, l.r, l.c, namespace, vm, peer, route.MigrationID, route.Target.String(), time.Now())
}

// leaseStore is the source proxy's proxy.LeaseStore: the kept leases,
// listed uncached at each check, and released as an operator would
// (kvnet.io/lease-release), for the claim controller to let go.
type leaseStore struct {
	r   client.Reader
	c   client.Client
	log logr.Logger
}

// Leased implements proxy.LeaseStore.
func (l leaseStore) Leased(ctx context.Context) ([]proxy.LeasedVM, error) {
	groups, err := persistentips.KeptLeases(ctx, l.r)
	if err != nil {
		return nil, err
	}
	out := make([]proxy.LeasedVM, 0, len(groups))
	for _, g := range groups {
		target, err := hop.ParseVMRef(g.Target)
		rt := hop.Route{MigrationID: g.MigrationID, Source: hop.VMRef{Namespace: g.Namespace, Name: g.VM}, Target: target}
		if err == nil {
			err = rt.Validate()
		}
		if err != nil {
			// Written by MarkLeases, or by hand: without a route to ask
			// about, the lease stays until an operator releases it.
			l.log.Info("a lease names no route the peer can be asked about: kept", "claims", g.Claims, "error", err.Error())
			continue
		}
		out = append(out, proxy.LeasedVM{Peer: g.Peer, Route: rt, Claims: g.Claims})
	}
	return out, nil
}

// Release implements proxy.LeaseStore.
func (l leaseStore) Release(ctx context.Context, vm proxy.LeasedVM, why string) error {
	return persistentips.ReleaseLeases(ctx, l.c, vm.Claims, why)
}

// vmHolders is the target proxy's proxy.VMHolders, read uncached: the VM
// holds the identity a migration carried while it exists, is not being
// deleted, and one of its claims (kvnet's, or any it controls) still holds
// IPs; its claims all released (its persistent networks removed), the IPs
// are free here too.
type vmHolders struct{ r client.Reader }

// Holds implements proxy.VMHolders.
func (h vmHolders) Holds(ctx context.Context, vm hop.VMRef) (bool, error) {
	var cur kubevirtv1.VirtualMachine
	switch err := h.r.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: vm.Name}, &cur); {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	case cur.DeletionTimestamp != nil:
		return false, nil
	}
	return persistentips.HoldsIPs(ctx, h.r, &cur)
}
