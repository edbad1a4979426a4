package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

var identitiesOffered = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_proxy_identities_offered_total",
	Help: "Network identities of migrations this proxy offered to the peer a sending VMIM names, by outcome: accepted, the target's refusal (final, or tried again with backoff while the sending VMIM is in flight), error (no answer; tried again) or rate-limited (held back by the per-namespace or total offer cap, not sent).",
}, []string{"outcome"})

// IdentitySource tells the network identity of a source VMI: per network
// that keeps persistent IPs, its claim's IPs, the network its claim is on
// and the interface's MAC. None means nothing to carry. kvnet proxy reads
// it from the VM's IPAMClaims (persistentips.SourceNetworks).
type IdentitySource interface {
	IdentityOf(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) ([]hop.NetworkIdentity, error)
}

// Offers that did not get a final answer are tried again with an
// exponential backoff per sending VMIM, from identityRetry up to
// identityRetryMax, for as long as the sending VMIM is in flight. The
// first retries come soon: the receive VMIM may not be in the target
// proxy's cache yet, and the target pod waits for the identity (it is
// denied until then).
const (
	identityRetry    = 2 * time.Second
	identityRetryMax = 2 * time.Minute
)

// Every offer is a handshake on the target's hop listener, which allows
// each source address DefaultHandshakeRate a second, and every offer of
// this proxy leaves from one address, with its streams. Offers are
// therefore capped, below that rate, twice: per namespace of the sending
// VMIM (a tenant's VMIMs with IDs nobody receives retry only within its
// share) and in all (so that however many namespaces offer, streams keep
// most of the handshake rate). An offer over a cap waits, without
// counting as a failure.
const (
	identityOffersPerNamespace      = 0.5 // a second
	identityOffersPerNamespaceBurst = 4
	identityOffersTotal             = 4 // a second
	identityOffersTotalBurst        = 8
)

// retryableOffer reports whether a refusal may turn into acceptance with
// time: the receive VMIM not yet seen, or seen twice, or bound to another
// peer for now; the address held by a pod or claim that may go; the
// target's store or rate limits. The others (the identity does not fit
// the receiving VM, the target pod already exists, the exchange is off)
// stay as they are until someone changes the VMs, and are final.
func retryableOffer(r hop.RefusalCode) bool {
	switch r {
	case hop.RefusedUnknownMigration, hop.RefusedLookup, hop.RefusedIdentityStore, hop.RefusedIdentityHeld, hop.RefusedAmbiguousMigration,
		hop.RefusedOtherPeer, hop.RefusedWrongVM, hop.RefusedHandshakeRate, hop.RefusedTooManyHandshakes:
		return true
	}
	return false
}

// offerState is where the offers of one source VMI stand.
type offerState struct {
	uid      types.UID // the sending VMIM offered for
	done     bool      // answered for good (accepted or finally refused)
	failures int
	next     time.Time // no offer before
}

// backoff is the wait after the n-th failed offer in a row.
func backoff(n int) time.Duration {
	d := identityRetry
	for i := 1; i < n && d < identityRetryMax; i++ {
		d *= 2
	}
	return min(d, identityRetryMax)
}

// offerIdentity offers the identity of a source VMI to the peer its
// sending VMIM names: when the proxy first sees the sending VMIM, which
// exists before the target pod can (virt-controller creates it only after
// the source has synchronized, which the source VMIM starts). Acceptance
// and final refusals end the offers of that VMIM; retryable ones
// (retryableOffer) and unanswered offers are tried again with backoff
// until the sending VMIM ends.
func (c *Controller) offerIdentity(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) reconcile.Result {
	key := types.NamespacedName{Namespace: vmi.Namespace, Name: vmi.Name}
	if c.Identities == nil || len(c.Peers) == 0 {
		return reconcile.Result{}
	}
	if vmim == nil {
		c.forgetOffers(key)
		return reconcile.Result{}
	}
	now := time.Now()
	st := c.offerState(key, vmim.UID)
	if st.done {
		return reconcile.Result{}
	}
	if now.Before(st.next) {
		return reconcile.Result{RequeueAfter: st.next.Sub(now)}
	}
	log := c.Log.WithValues("vmi", vmi.Namespace+"/"+vmi.Name, "vmim", vmim.Name, "migrationID", vmim.Spec.SendTo.MigrationID)
	peer, err := PeerFor(c.Peers, vmim.Spec.SendTo.ConnectURL)
	if err != nil {
		return reconcile.Result{} // the relays log it and hold the migration back
	}
	route, err := RouteOf(vmi, vmim)
	if err != nil {
		identitiesOffered.WithLabelValues("error").Inc()
		log.Error(err, "the sending VMIM names no VM to receive the migration; not offering its network identity")
		c.setOffers(key, offerState{uid: vmim.UID, done: true})
		return reconcile.Result{}
	}
	if wait := c.offerSlot(vmi.Namespace, now); wait > 0 {
		identitiesOffered.WithLabelValues("rate-limited").Inc()
		return reconcile.Result{RequeueAfter: wait}
	}
	retry := func() reconcile.Result {
		st.failures++
		st.next = now.Add(backoff(st.failures))
		c.setOffers(key, st)
		return reconcile.Result{RequeueAfter: st.next.Sub(now)}
	}
	nets, err := c.Identities.IdentityOf(ctx, vmi)
	if err != nil {
		identitiesOffered.WithLabelValues("error").Inc()
		log.Error(err, "reading the VM's network identity; trying again")
		return retry()
	}
	if len(nets) == 0 {
		c.setOffers(key, offerState{uid: vmim.UID, done: true})
		return reconcile.Result{}
	}
	err = c.Dialer.OfferIdentity(ctx, peer, hop.Identity{Route: route, Networks: nets})
	var re *hop.RefusedError
	switch {
	case err == nil:
		identitiesOffered.WithLabelValues("accepted").Inc()
		log.Info("the peer took the migration's network identity", "peer", peer.Name, "networks", len(nets))
	case errors.As(err, &re) && retryableOffer(re.Reason):
		identitiesOffered.WithLabelValues(re.Reason.String()).Inc()
		res := retry()
		log.Info("the peer refused the migration's network identity for now; offering again", "peer", peer.Name,
			"reason", re.Reason.String(), "failures", st.failures, "retryIn", res.RequeueAfter.String())
		return res
	case errors.As(err, &re):
		identitiesOffered.WithLabelValues(re.Reason.String()).Inc()
		log.Info("the peer refused the migration's network identity; its target pod will not be admitted", "peer", peer.Name, "reason", re.Reason.String())
	default:
		identitiesOffered.WithLabelValues("error").Inc()
		res := retry()
		log.Info("offering the migration's network identity failed; offering again", "peer", peer.Name, "error", err.Error(),
			"failures", st.failures, "retryIn", res.RequeueAfter.String())
		return res
	}
	c.setOffers(key, offerState{uid: vmim.UID, done: true})
	return reconcile.Result{}
}

// offerSlot takes a token of the namespace's and of the total offer
// budget, or says how long to wait for both.
func (c *Controller) offerSlot(namespace string, now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.offersByNamespace == nil {
		c.offersByNamespace = newKeyedLimiter(rate.Limit(identityOffersPerNamespace), identityOffersPerNamespaceBurst)
		c.offersTotal = rate.NewLimiter(identityOffersTotal, identityOffersTotalBurst)
	}
	if !c.offersByNamespace.allow(namespace, now) {
		return time.Duration(float64(time.Second) / identityOffersPerNamespace)
	}
	if !c.offersTotal.AllowN(now, 1) {
		return time.Second / identityOffersTotal
	}
	return 0
}

// offerState is the state of vmi's offers for the sending VMIM uid: a
// new VMIM starts afresh.
func (c *Controller) offerState(vmi types.NamespacedName, uid types.UID) offerState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.identities[vmi]; ok && st.uid == uid {
		return st
	}
	return offerState{uid: uid}
}

// setOffers records vmi's offer state. The map holds only VMIs being
// migrated (forgetOffers); a restart offers again, which the target takes
// as the same identity.
func (c *Controller) setOffers(vmi types.NamespacedName, st offerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.identities == nil {
		c.identities = map[types.NamespacedName]offerState{}
	}
	c.identities[vmi] = st
}

func (c *Controller) forgetOffers(vmi types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.identities, vmi)
}
