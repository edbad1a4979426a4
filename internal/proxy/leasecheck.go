package proxy

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

var leaseChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_proxy_lease_checks_total",
	Help: "Lease checks this source proxy asked a peer: held (the VM still exists there; the lease stays), released (it is gone; the lease is released), error (no answer; the lease stays), by peer and outcome.",
}, []string{"peer", "outcome"})

// VMHolders tells the target side whether a VM exists in this cluster
// and is not being deleted: the VM a migration moved here, which a lease
// check names.
type VMHolders interface {
	Holds(ctx context.Context, vm hop.VMRef) (bool, error)
}

// answerLease answers a configured peer's lease check: Accepted while the
// route's receiving VM exists here, RefusedNotHeld once it is gone. A
// peer learns only whether a VM of that namespace and name exists; the
// peers are clusters this one trusts with its migrations.
func (s *TargetServer) answerLease(ctx context.Context, log logr.Logger, peer *Peer, conn net.Conn, q *hop.LeaseCheck) {
	log = log.WithValues("request", "lease-check", "migrationID", q.MigrationID, "target", q.Target.String())
	if s.Holders == nil {
		s.refuse(log, peer.Name, hop.RefusedIdentityOff, nil)
		_, _ = conn.Write([]byte{byte(hop.RefusedIdentityOff)})
		return
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout))
	defer cancel()
	held, err := s.Holders.Holds(ctx, q.Target)
	if err != nil {
		s.refuse(log, peer.Name, hop.RefusedLookup, err)
		_, _ = conn.Write([]byte{byte(hop.RefusedLookup)})
		return
	}
	verdict := hop.Accepted
	if !held {
		verdict = hop.RefusedNotHeld
	}
	log.V(1).Info("answered a lease check", "held", held)
	_, _ = conn.Write([]byte{byte(verdict)})
}

// CheckLease asks peer whether the receiving VM of q still holds the
// identity the migration carried there: true, false, or an error when the
// peer gave no answer (unreachable, refused, or a proxy that predates the
// check), in which case the lease must be kept.
func (d *Dialer) CheckLease(ctx context.Context, peer *Peer, q hop.LeaseCheck) (bool, error) {
	req, err := q.MarshalBinary()
	if err != nil {
		return false, err
	}
	err = d.offer(ctx, peer, req, "the lease check")
	var ref *hop.RefusedError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ref) && ref.Reason == hop.RefusedNotHeld:
		return false, nil
	}
	return false, err
}

// LeasedVM is a VM that moved to a peer and whose claims the source keeps
// as leases of that peer.
type LeasedVM struct {
	Peer  string
	Route hop.Route
	// Claims are the claims kept for it.
	Claims []types.NamespacedName
}

// LeaseStore reads the leases kept in this cluster and releases them
// (persistentips: the claims' lease annotations, and kvnet.io/lease-release).
type LeaseStore interface {
	Leased(ctx context.Context) ([]LeasedVM, error)
	Release(ctx context.Context, vm LeasedVM, why string) error
}

// DefaultLeaseCheckInterval is how often the source asks its peers about
// the leases it keeps.
const DefaultLeaseCheckInterval = 5 * time.Minute

// LeaseChecker asks, every Interval, the peer of each kept lease whether
// the VM still holds its identity there, and releases the lease when the
// peer says it does not. A peer that does not answer keeps its leases (the
// oldest lease's age, and its alert, show it). It runs on every replica
// (a check asked twice is harmless), and needs no leader election.
type LeaseChecker struct {
	Leases   LeaseStore
	Dialer   *Dialer
	Peers    []*Peer
	Interval time.Duration
	Log      logr.Logger
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (c *LeaseChecker) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable: a check at once, then every Interval.
func (c *LeaseChecker) Start(ctx context.Context) error {
	t := time.NewTicker(orDefault(c.Interval, DefaultLeaseCheckInterval))
	defer t.Stop()
	for {
		c.CheckOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// CheckOnce asks about every kept lease once.
func (c *LeaseChecker) CheckOnce(ctx context.Context) {
	vms, err := c.Leases.Leased(ctx)
	if err != nil {
		c.Log.Error(err, "listing the leases kept here")
		return
	}
	for _, vm := range vms {
		peer := c.peer(vm.Peer)
		if peer == nil {
			leaseChecks.WithLabelValues(vm.Peer, "error").Inc()
			c.Log.Info("a lease names a peer this proxy is not configured with: kept", "peer", vm.Peer, "migrationID", vm.Route.MigrationID)
			continue
		}
		held, err := c.Dialer.CheckLease(ctx, peer, hop.LeaseCheck{Route: vm.Route})
		switch {
		case err != nil:
			leaseChecks.WithLabelValues(peer.Name, "error").Inc()
			c.Log.Info("the peer did not answer a lease check: the lease is kept", "peer", peer.Name, "migrationID", vm.Route.MigrationID, "error", err.Error())
		case held:
			leaseChecks.WithLabelValues(peer.Name, "held").Inc()
		default:
			leaseChecks.WithLabelValues(peer.Name, "released").Inc()
			why := "peer " + peer.Name + " reports that " + vm.Route.Target.String() + " no longer exists there"
			if err := c.Leases.Release(ctx, vm, why); err != nil {
				c.Log.Error(err, "releasing a lease the peer let go", "peer", peer.Name, "migrationID", vm.Route.MigrationID)
				continue
			}
			c.Log.Info("released a lease: the peer no longer holds the VM", "peer", peer.Name, "migrationID", vm.Route.MigrationID, "target", vm.Route.Target.String(), "claims", len(vm.Claims))
		}
	}
}

func (c *LeaseChecker) peer(name string) *Peer {
	for _, p := range c.Peers {
		if p.Name == name {
			return p
		}
	}
	return nil
}
