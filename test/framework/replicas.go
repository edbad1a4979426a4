package framework

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/config"
)

// ReplicaOptions describe one more kvnet process run against a control plane
// that is already up, as a second pod of the Deployment would be.
type ReplicaOptions struct {
	// ConfigPath is the policy file; the replica runs a config.Watcher on it,
	// exactly as `kvnet webhook` does.
	ConfigPath string
	// LeaderElectionID is the lease replicas compete for; replicas of one test
	// share it, tests do not.
	LeaderElectionID string
	// Name tells replicas apart in logs.
	Name string
}

// Replica is a running kvnet manager under leader election, with its own
// config watcher. It serves no webhook port: replicas exist to test what runs
// on the leader and what runs everywhere.
type Replica struct {
	Manager manager.Manager
	Watcher *config.Watcher

	cancel context.CancelFunc
	done   chan error
}

// StartReplica starts a replica against cfg and returns once its manager runs.
func StartReplica(cfg *rest.Config, o ReplicaOptions) (*Replica, error) {
	log := ctrl.Log.WithName(o.Name)
	w, err := config.NewWatcher(o.ConfigPath, KvnetNamespace, log.WithName("config"))
	if err != nil {
		return nil, err
	}
	w.Poll = 250 * time.Millisecond
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), log))
	mgr, err := app.NewManager(ctx, cfg, app.ServeOptions{
		Port: -1, MetricsAddr: "0", ProbeAddr: "0", TLSMinVersion: "1.2",
		LeaderElect: true, LeaderElectionID: o.LeaderElectionID, Namespace: KvnetNamespace,
		SeveralManagers: true,
		LeaseDuration:   2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 250 * time.Millisecond,
	}, &w.Source)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := mgr.Add(w); err != nil {
		cancel()
		return nil, err
	}
	r := &Replica{Manager: mgr, Watcher: w, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- mgr.Start(ctx) }()
	return r, nil
}

// Leader reports whether this replica holds the lease.
func (r *Replica) Leader() bool {
	select {
	case <-r.Manager.Elected():
		return true
	default:
		return false
	}
}

// Stop cancels the replica, as a pod being deleted, and waits for its manager
// to return. The lease is released on the way out.
func (r *Replica) Stop() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(90 * time.Second):
		return fmt.Errorf("replica did not stop within 90s")
	}
}
