package persistentips

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvnet/kvnet/internal/metrics"
)

// Release reasons, the values of the released counter's reason label.
const (
	ReasonVMDeleted = "vm-deleted"
	ReasonVMIGone   = "vmi-gone"
	// ReasonNetworkChanged: the VM network now attaches another network
	// (a NAD of another name), so its claim is deleted and created again.
	ReasonNetworkChanged = "network-changed"
	// ReasonLeaseReleased: an operator released the lease of a VM that
	// moved to another cluster (LeaseReleaseAnnotation).
	ReasonLeaseReleased = "lease-released"
)

var (
	claimsCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_persistentips_claims_created_total",
		Help: "IPAMClaims kvnet created for VM networks whose NAD allows persistent IPs.",
	})
	claimsReleased = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_persistentips_claims_released_total",
		Help: "IPAMClaims whose kvnet finalizer was removed, by reason (vm-deleted, vmi-gone, network-changed).",
	}, []string{"reason"})
	claimsLeaked = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_persistentips_claims_leaked",
		Help: "IPAMClaims kvnet holds for a live VM that no network of the VM uses any more (network removed, or its NAD no longer allows persistent IPs): their IPs stay reserved until the VM is deleted.",
	})
	claimsHeld = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_persistentips_claims_held_for_launcher_total",
		Help: "Times kvnet kept the claim of a standalone VMI that is gone because its launcher pod is still active (the IP is released when the pod goes).",
	})
	claimConflicts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_persistentips_claim_conflicts_total",
		Help: "Times kvnet found the IPAMClaim it wanted already controlled by another object and did not adopt it.",
	})
	claimsTakenOver = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_persistentips_claims_taken_over_total",
		Help: "IPAMClaims made by kubevirt/ipam-extensions that kvnet adopted in place and whose kubevirt.io/persistent-ipam finalizer it removed once ipam-extensions was no longer installed (its webhook gone).",
	})
	identitiesReceived = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_persistentips_identities_received_total",
		Help: "Network identities of cross-cluster migrations a peer sent, by outcome: accepted (written into the receiving VM's claims) or why they were refused (target-pod-exists, network-name, outside-subnets, ip-held, claim-conflict).",
	}, []string{"outcome"})
)

// RegisterMetrics registers the persistent-IP controllers' metrics on reg.
func RegisterMetrics(reg prometheus.Registerer) error {
	// Both reasons exist from the start, so the first release is an
	// increase a rate() sees.
	claimsReleased.WithLabelValues(ReasonVMDeleted)
	claimsReleased.WithLabelValues(ReasonVMIGone)
	claimsReleased.WithLabelValues(ReasonNetworkChanged)
	claimsReleased.WithLabelValues(ReasonLeaseReleased)
	for _, o := range []string{OutcomeAccepted, ReasonLate, ReasonNetworkName, ReasonOutsideSubnets, ReasonHeld, ReasonClaim} {
		identitiesReceived.WithLabelValues(o)
	}
	return metrics.Register(reg, claimsCreated, claimsReleased, claimsLeaked, claimsHeld, claimConflicts, identitiesReceived, claimsTakenOver, leases)
}

// leakTracker sums, over all owners, the claims that are held but unused,
// so the gauge is right however reconciles interleave.
type leakTracker struct {
	mu     sync.Mutex
	counts map[string]int
	total  int
}

func (l *leakTracker) set(owner string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.total += n - l.counts[owner]
	if n == 0 {
		delete(l.counts, owner)
	} else {
		l.counts[owner] = n
	}
	claimsLeaked.Set(float64(l.total))
}
