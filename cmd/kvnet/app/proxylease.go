package app

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/leaderelection"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/internal/proxy/store"
)

// existingLease is the leader election lock of a proxy that does not create
// its objects (no --create-objects): it gets and updates the Lease the
// chart created, as client-go's leader election does with any Lease it
// finds, and where client-go would create a missing one it gets an error
// naming the Lease instead, which the elector logs on every try. So the
// proxy's ServiceAccount needs no create on leases in kvnet's namespace.
//
// The manager takes the lock before it exists, and the lock needs the
// manager's event recorder for its "became leader" events: NewProxyManager
// fills Interface in right after ctrl.NewManager, before anything runs.
type existingLease struct {
	resourcelock.Interface
	key types.NamespacedName
}

func (l *existingLease) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	return &store.MissingObjectError{Kind: "Lease", Key: l.key}
}

// leaderRenewDeadline is controller-runtime's default RenewDeadline, which
// the proxy keeps; the lock's API client times out at half of it, as
// controller-runtime's own lock does.
const leaderRenewDeadline = 10 * time.Second

// fill builds the Lease lock controller-runtime would (same identity
// scheme, client timeout and event recorder) inside l.
func (l *existingLease) fill(cfg *rest.Config, mgr manager.Manager) error {
	lock, err := leaderelection.NewResourceLock(cfg, mgr, leaderelection.Options{
		LeaderElection: true, LeaderElectionID: l.key.Name, LeaderElectionNamespace: l.key.Namespace,
		RenewDeadline: leaderRenewDeadline,
	})
	if err != nil {
		return fmt.Errorf("building the leader election lock on Lease %s: %w", l.key, err)
	}
	l.Interface = lock
	return nil
}
