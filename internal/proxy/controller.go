package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
)

// Controller keeps one set of relays per source VMI of an in-flight
// decentralized migration whose target has reported its endpoint, and
// publishes them on the VMI (AnnotationMapping). It must run as a single
// active instance (leader election): two proxies would publish two mappings
// for one migration and make virt-handler restart its own proxies.
type Controller struct {
	// Client reads VMIs and VMIMs (the manager's cached client) and patches
	// the annotation.
	Client client.Client
	// Address is the address the relays listen on and the one published:
	// the proxy pod's address on the network the source virt-handlers use.
	Address string
	// DialTimeout is passed to each Relay.
	DialTimeout time.Duration
	// Store is where mappings are published; the rewrite trusts only it.
	// StoreReader reads it back (the API reader: a cached read would start
	// a cluster-wide ConfigMap informer the proxy has no RBAC for).
	Store       store.MappingStore
	StoreReader client.Reader
	// Peers are the other clusters' proxies and Dialer opens the hop to
	// them. Without peers the relays dial the remote node directly (a flat
	// network where every node is reachable; not the documented setup).
	Peers  []*Peer
	Dialer *Dialer
	// Limiter caps the migrations relayed at once (shared with the target
	// side); AllowedSources, IdleTimeout and MaxRelayConns (its MaxConns)
	// are passed to each Relay.
	Limiter        *Limiter
	AllowedSources []netip.Prefix
	IdleTimeout    time.Duration
	MaxRelayConns  int
	// Identities, if set, tells the network identity of a source VMI,
	// which is offered to the peer as soon as the sending VMIM is seen
	// (offerIdentity); nil offers none.
	Identities IdentitySource
	// Leases, if set, makes leases of the claims of a VM whose sending
	// VMIM succeeded (markLeases); nil makes none.
	Leases LeaseMarker
	// Log is the controller's logger.
	Log logr.Logger

	mu                sync.Mutex
	identities        map[types.NamespacedName]offerState
	offersByNamespace *keyedLimiter
	offersTotal       *rate.Limiter
	base              context.Context
	stop              context.CancelFunc
	sessions          map[types.NamespacedName]*session
	// leased are the succeeded sending VMIMs whose claims this process
	// has made leases: a VMI key is reconciled again on every event of its
	// VMI or VMIMs, and marking reads the namespace's claims from the API
	// server, once per move is enough.
	leased sync.Map // types.UID -> struct{}
}

// session is the relays of one migration of one VMI.
type session struct {
	remote  Remote
	mapping store.Mapping
	cancel  context.CancelFunc
	done    sync.WaitGroup
}

func (s *session) close() {
	s.cancel()
	s.done.Wait()
}

// Setup registers the controller with mgr. The relays live as long as the
// manager runs: when it stops (lost leadership, shutdown) they all close.
func Setup(mgr manager.Manager, c *Controller) error {
	if net.ParseIP(c.Address) == nil {
		return fmt.Errorf("proxy address %q is not an IP address: virt-handler dials it as the target node address", c.Address)
	}
	if c.Client == nil {
		c.Client = mgr.GetClient()
	}
	if c.StoreReader == nil {
		c.StoreReader = mgr.GetAPIReader()
	}
	c.base, c.stop = context.WithCancel(context.Background())
	c.sessions = map[types.NamespacedName]*session{}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		c.closeAll()
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("migration-proxy").
		For(&kubevirtv1.VirtualMachineInstance{}).
		Watches(&kubevirtv1.VirtualMachineInstanceMigration{}, handler.EnqueueRequestsFromMapFunc(
			func(_ context.Context, o client.Object) []reconcile.Request {
				m, ok := o.(*kubevirtv1.VirtualMachineInstanceMigration)
				if !ok || m.Spec.SendTo == nil || m.Spec.VMIName == "" {
					return nil
				}
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.VMIName}}}
			})).
		Complete(c)
}

// Reconcile implements reconcile.Reconciler.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := c.Log.WithValues("vmi", req.NamespacedName)
	if err := c.markLeases(ctx, log, req.NamespacedName); err != nil {
		return reconcile.Result{}, err
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := c.Client.Get(ctx, req.NamespacedName, &vmi); err != nil {
		if apierrors.IsNotFound(err) {
			c.closeSession(log, req.NamespacedName, "the VMI is gone")
			c.forgetOffers(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading VMI %s: %w", req.NamespacedName, err)
	}
	vmim, err := SourceMigration(ctx, c.Client, &vmi)
	if err != nil {
		return reconcile.Result{}, err
	}
	// The identity first: the target pod waits for it, the relays wait
	// for the target pod's endpoint.
	retry := c.offerIdentity(ctx, &vmi, vmim)
	res, err := c.relays(ctx, log, &vmi, vmim)
	if err == nil && res.RequeueAfter == 0 {
		res = retry
	}
	return res, err
}

// relays opens, keeps or closes the relays of vmi's migration vmim (nil:
// none in flight) and publishes them.
func (c *Controller) relays(ctx context.Context, log logr.Logger, vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) (reconcile.Result, error) {
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(vmi)}
	remote, ok := RemoteOf(vmi, vmim)
	if ok {
		route, err := RouteOf(vmi, vmim)
		if err != nil {
			log.Error(err, "holding the migration back: the sending VMIM names no VM to receive it", "migrationID", remote.MigrationID)
			c.closeSession(log, req.NamespacedName, "no receiving VM")
			return reconcile.Result{}, c.publish(ctx, vmi, "")
		}
		remote.Receiver = route.Target
	}
	if !ok {
		c.closeSession(log, req.NamespacedName, "no in-flight decentralized migration with a target endpoint")
		return reconcile.Result{}, c.publish(ctx, vmi, "")
	}
	if err := CheckMigrationPorts(remote.Ports); err != nil {
		// Not what KubeVirt's virt-handler writes: open no listener for it.
		// A status change enqueues the VMI again.
		refused.WithLabelValues("source", hop.RefusedBadPorts.String()).Inc()
		log.Error(err, "holding the migration back: its target endpoint is not one KubeVirt announces", "migrationID", remote.MigrationID)
		c.closeSession(log, req.NamespacedName, "target ports not KubeVirt's")
		return reconcile.Result{}, c.publish(ctx, vmi, "")
	}
	var peer *Peer
	if len(c.Peers) > 0 {
		var err error
		if peer, err = PeerFor(c.Peers, vmim.Spec.SendTo.ConnectURL); err != nil {
			log.Error(err, "holding the migration back: no peer proxy serves its target cluster", "migrationID", remote.MigrationID)
			c.closeSession(log, req.NamespacedName, "no peer proxy")
			return reconcile.Result{}, c.publish(ctx, vmi, "")
		}
	}
	published, err := c.Store.Get(ctx, c.StoreReader, req.NamespacedName)
	if err != nil {
		return reconcile.Result{}, err
	}
	s, err := c.ensureSession(log, req.NamespacedName, remote, peer, published)
	if err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, c.publish(ctx, vmi, s.mapping.Encode())
}

// ensureSession returns the relays for remote, opening them if the VMI has
// none or has relays for another endpoint. After a restart it first tries
// the local ports of a still-matching published mapping, so virt-handler
// keeps the same address and ports (it restarts its own proxies when they
// change).
func (c *Controller) ensureSession(log logr.Logger, key types.NamespacedName, remote Remote, peer *Peer, published string) (*session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.base.Err() != nil {
		return nil, errors.New("the migration proxy is stopping")
	}
	if s := c.sessions[key]; s != nil {
		if s.remote.Same(remote) {
			return s, nil
		}
		log.Info("migration endpoint changed; closing its relays", "migrationID", s.remote.MigrationID)
		c.dropLocked(key)
	}
	var prev store.Mapping
	if published != "" {
		if m, err := store.DecodeMapping(published); err == nil && remote.Matches(m) && m.Address == c.Address {
			prev = m
		}
	}
	ctx, cancel := context.WithCancel(c.base)
	s := &session{remote: remote, cancel: cancel, mapping: store.Mapping{
		MigrationID: remote.MigrationID, Address: c.Address, Target: remote.Target, Ports: map[string]string{},
	}}
	for remotePort := range remote.Ports {
		ln, err := c.listen(prev.Ports[remotePort])
		if err != nil {
			s.close()
			return nil, err
		}
		local := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		s.mapping.Ports[remotePort] = local
		r := &Relay{
			Target: net.JoinHostPort(remote.Target, remotePort), DialTimeout: c.DialTimeout,
			MigrationID: remote.MigrationID, Namespace: key.Namespace, Limiter: c.Limiter, MaxConns: c.MaxRelayConns, AllowedSources: c.AllowedSources, IdleTimeout: c.IdleTimeout,
			Log: log.WithValues("migrationID", remote.MigrationID, "listen", ln.Addr().String()),
		}
		if peer != nil {
			port, err := strconv.ParseUint(remotePort, 10, 16)
			if err != nil {
				_ = ln.Close()
				s.close()
				return nil, fmt.Errorf("targetState.directMigrationNodePorts key %q is not a port", remotePort)
			}
			route, d := hop.Route{MigrationID: remote.MigrationID, Source: hop.VMRef(key), Target: remote.Receiver}, c.Dialer
			r.Upstream = func(ctx context.Context) (net.Conn, error) { return d.Dial(ctx, peer, route, uint16(port)) }
		}
		s.done.Add(1)
		listeners.Inc()
		go func() {
			defer s.done.Done()
			defer listeners.Dec()
			if err := r.Serve(ctx, ln); err != nil {
				log.Error(err, "relay listener failed", "listen", ln.Addr().String())
			}
		}()
	}
	c.sessions[key] = s
	log.Info("relays open", "migrationID", remote.MigrationID, "target", remote.Target, "ports", s.mapping.Ports)
	return s, nil
}

// listen opens a relay listener on the proxy address, on port if it is free
// (a restart reusing its published ports), else on any free port.
func (c *Controller) listen(port string) (net.Listener, error) {
	if port != "" {
		if ln, err := net.Listen("tcp", net.JoinHostPort(c.Address, port)); err == nil {
			return ln, nil
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(c.Address, "0"))
	if err != nil {
		return nil, fmt.Errorf("opening a relay listener on %s: %w", c.Address, err)
	}
	return ln, nil
}

// publish writes the mapping to the store, then sets (or, with value "",
// removes) the trigger annotation with an
// optimistic lock, so a write based on a stale VMI fails and is retried
// instead of overwriting a concurrent status change. The write goes through
// the StatusRewriter, which points the top-level fields at the relays in the
// same request.
func (c *Controller) publish(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance, value string) error {
	cur, has := vmi.Annotations[store.AnnotationMapping]
	if (value == "" && !has) || (value != "" && cur == value) {
		return nil
	}
	if err := c.Store.Put(ctx, c.Client, client.ObjectKeyFromObject(vmi), value); err != nil {
		return err
	}
	orig := vmi.DeepCopy()
	if value == "" {
		delete(vmi.Annotations, store.AnnotationMapping)
	} else {
		if vmi.Annotations == nil {
			vmi.Annotations = map[string]string{}
		}
		vmi.Annotations[store.AnnotationMapping] = value
	}
	if err := c.Client.Patch(ctx, vmi, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("publishing the migration proxy mapping on VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return nil
}

func (c *Controller) closeSession(log logr.Logger, key types.NamespacedName, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.sessions[key]; s != nil {
		log.Info("closing relays", "migrationID", s.remote.MigrationID, "reason", why)
		c.dropLocked(key)
	}
}

func (c *Controller) dropLocked(key types.NamespacedName) {
	c.sessions[key].close()
	delete(c.sessions, key)
}

func (c *Controller) closeAll() {
	c.stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for key := range c.sessions {
		c.dropLocked(key)
	}
}
