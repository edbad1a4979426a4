package framework

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
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
	// Namespace is the replica's own namespace (--namespace): its lease,
	// its migration-address allocations. Default KvnetNamespace; tests
	// whose replicas must not share state with the suite's kvnet give
	// them one of their own.
	Namespace string
	// CertDir, when set, makes the replica serve its webhooks, on a
	// loopback listener of its own with tls.crt and tls.key from CertDir
	// (envtest's serving certificate); Replica.Addr says where.
	CertDir string
}

// Replica is a running kvnet manager under leader election, with its own
// config watcher. It serves no webhook port: replicas exist to test what runs
// on the leader and what runs everywhere.
type Replica struct {
	Manager manager.Manager
	Watcher *config.Watcher
	// Addr is where the replica serves its webhooks (host:port), when
	// ReplicaOptions.CertDir asked it to.
	Addr string

	webhooks *http.Server
	cancel   context.CancelFunc
	done     chan error
}

// StartReplica starts a replica against cfg and returns once its manager runs.
func StartReplica(cfg *rest.Config, o ReplicaOptions) (*Replica, error) {
	log := ctrl.Log.WithName(o.Name)
	if o.Namespace == "" {
		o.Namespace = KvnetNamespace
	}
	w, err := config.NewWatcher(o.ConfigPath, o.Namespace, log.WithName("config"))
	if err != nil {
		return nil, err
	}
	w.Poll = 250 * time.Millisecond
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), log))
	mgr, err := app.NewManager(ctx, cfg, app.ServeOptions{
		Port: -1, MetricsAddr: "0", ProbeAddr: "0", TLSMinVersion: "1.2",
		LeaderElect: true, LeaderElectionID: o.LeaderElectionID, Namespace: o.Namespace,
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
	if o.CertDir != "" {
		if err := r.serveWebhooks(o.CertDir); err != nil {
			cancel()
			return nil, err
		}
	}
	go func() { r.done <- mgr.Start(ctx) }()
	return r, nil
}

// serveWebhooks serves the handlers app.NewManager registered on the
// manager's webhook server (which itself listens nowhere: Port -1) on a
// listener opened here and kept, so no other process can take the port
// between choosing it and binding it.
func (r *Replica) serveWebhooks(certDir string) error {
	pair, err := tls.LoadX509KeyPair(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	if err != nil {
		return fmt.Errorf("replica serving certificate: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	r.Addr = l.Addr().String()
	r.webhooks = &http.Server{
		Handler:           r.Manager.GetWebhookServer().WebhookMux(),
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
	}
	go func() { _ = r.webhooks.ServeTLS(l, "", "") }()
	return nil
}

// Kill ends the replica as a killed pod ends: its webhook connections drop
// at once (the API server's calls in flight fail), then cutOff runs (a
// test cuts the replica off the API server there, so it cannot even
// release its lease), then the manager is cancelled and awaited. Losing
// the lease on the way is what a killed leader does, not an error.
func (r *Replica) Kill(cutOff func()) error {
	if r.webhooks != nil {
		_ = r.webhooks.Close()
	}
	if cutOff != nil {
		cutOff()
	}
	err := r.Stop()
	if err != nil && strings.Contains(err.Error(), "leader election lost") {
		return nil
	}
	return err
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
	if r.webhooks != nil {
		_ = r.webhooks.Close()
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
