package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

var identitiesOffered = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_proxy_identities_offered_total",
	Help: "Network identities of migrations this proxy offered to the peer a sending VMIM names, by outcome: accepted, the target's refusal, or error (the offer did not get an answer; it is tried again).",
}, []string{"outcome"})

// IdentitySource tells the network identity of a source VMI: per network
// that keeps persistent IPs, its claim's IPs, the network its claim is on
// and the interface's MAC. None means nothing to carry. kvnet proxy reads
// it from the VM's IPAMClaims (persistentips.SourceNetworks).
type IdentitySource interface {
	IdentityOf(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) ([]NetworkIdentity, error)
}

// identityRetry is how soon an unanswered or not-yet-placeable identity is
// offered again: the receive VMIM may not be in the target proxy's cache
// yet, and the target pod waits for the identity (it is denied until then).
const identityRetry = 2 * time.Second

// offerIdentity offers the identity of a source VMI to the peer its
// sending VMIM names, once per VMIM: when the proxy first sees the sending
// VMIM, which exists before the target pod can (virt-controller creates
// it only after the source has synchronized, which the source VMIM
// starts). A refusal the target will give again (a mismatch, a late
// identity, another peer) is final and logged; unknown-migration (the
// receive VMIM not in its cache yet) and failures are retried.
func (c *Controller) offerIdentity(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) reconcile.Result {
	key := types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
	if c.Identities == nil || len(c.Peers) == 0 {
		return reconcile.Result{}
	}
	if vmim == nil {
		c.markOffered(key, "")
		return reconcile.Result{}
	}
	if c.offered(key, vmim.UID) {
		return reconcile.Result{}
	}
	log := c.Log.WithValues("vmi", vmi.Namespace+"/"+vmi.Name, "vmim", vmim.Name, "migrationID", vmim.Spec.SendTo.MigrationID)
	peer, err := PeerFor(c.Peers, vmim.Spec.SendTo.ConnectURL)
	if err != nil {
		return reconcile.Result{} // the relays log it and hold the migration back
	}
	nets, err := c.Identities.IdentityOf(ctx, vmi)
	if err != nil {
		identitiesOffered.WithLabelValues("error").Inc()
		log.Error(err, "reading the VM's network identity; trying again")
		return reconcile.Result{RequeueAfter: identityRetry}
	}
	if len(nets) == 0 {
		c.markOffered(key, vmim.UID)
		return reconcile.Result{}
	}
	route, err := RouteOf(vmi, vmim)
	if err != nil {
		identitiesOffered.WithLabelValues("error").Inc()
		log.Error(err, "the sending VMIM names no VM to receive the migration; not offering its network identity")
		c.markOffered(key, vmim.UID)
		return reconcile.Result{}
	}
	id := Identity{Route: route, Networks: nets}
	err = c.Dialer.OfferIdentity(ctx, peer, id)
	var re *RefusedError
	switch {
	case err == nil:
		identitiesOffered.WithLabelValues("accepted").Inc()
		log.Info("the peer took the migration's network identity", "peer", peer.Name, "networks", len(nets))
	case errors.As(err, &re) && re.Reason != RefusedUnknownMigration && re.Reason != RefusedLookup && re.Reason != RefusedIdentityStore:
		identitiesOffered.WithLabelValues(re.Reason.String()).Inc()
		log.Info("the peer refused the migration's network identity; its target pod will not be admitted", "peer", peer.Name, "reason", re.Reason.String())
	default:
		identitiesOffered.WithLabelValues("error").Inc()
		log.Info("offering the migration's network identity failed; trying again", "peer", peer.Name, "error", err.Error())
		return reconcile.Result{RequeueAfter: identityRetry}
	}
	c.markOffered(key, vmim.UID)
	return reconcile.Result{}
}

func (c *Controller) offered(vmi types.NamespacedName, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.identities[vmi] == uid
}

// markOffered remembers, per source VMI, the sending VMIM whose identity
// needs no further offer; uid "" forgets the VMI (no migration in flight),
// so the map holds only VMIs being migrated. A restart offers again,
// which the target takes as the same identity.
func (c *Controller) markOffered(vmi types.NamespacedName, uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if uid == "" {
		delete(c.identities, vmi)
		return
	}
	if c.identities == nil {
		c.identities = map[types.NamespacedName]types.UID{}
	}
	c.identities[vmi] = uid
}
