package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kvnet/kvnet/internal/proxy/store"
)

// bindingsHeld follows the bindings ConfigMap as this process's cache sees
// it (every replica exports the same figure: aggregate with max, not sum).
var bindingsHeld = prometheus.NewGauge(prometheus.GaugeOpts{
	Name: "kvnet_proxy_bindings",
	Help: "Migration bindings (migration ID to peer proxy) held in the bindings ConfigMap; they are removed when their receiving VMIM ends.",
})

// SetupBindings completes s (c, a running cache of the bindings ConfigMap
// alone, and the API reader and client from mgr), keeps the
// kvnet_proxy_bindings gauge in step with the ConfigMap, and registers the
// BindingCollector. Pass the result as TargetServer.Bindings.
func SetupBindings(mgr manager.Manager, s store.BindingStore, c cache.Cache, log logr.Logger) (*store.BindingStore, error) {
	inf, err := c.GetInformer(context.Background(), &corev1.ConfigMap{})
	if err != nil {
		return nil, err
	}
	count := func(o any) {
		if cm, ok := o.(*corev1.ConfigMap); ok {
			bindingsHeld.Set(float64(len(cm.Data)))
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    count,
		UpdateFunc: func(_, o any) { count(o) },
		DeleteFunc: func(any) { bindingsHeld.Set(0) },
	}); err != nil {
		return nil, fmt.Errorf("watching the migration bindings: %w", err)
	}
	s.Reader, s.APIReader, s.Client = c, mgr.GetAPIReader(), mgr.GetClient()
	held := &s
	bc := &BindingCollector{Store: held, Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Log: log}
	receiving := predicate.NewPredicateFuncs(func(o client.Object) bool {
		m, ok := o.(*kubevirtv1.VirtualMachineInstanceMigration)
		return ok && m.Spec.Receive != nil
	})
	// Each binding's VMIM is checked when the ConfigMap is first listed
	// (a new leader's start): a VMIM deleted while no leader ran sends no
	// event of its own.
	ofEntries := handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, cm *corev1.ConfigMap) []reconcile.Request {
		var out []reconcile.Request
		seen := map[types.NamespacedName]bool{}
		for _, raw := range cm.Data {
			b, err := store.DecodeBinding(raw)
			if err != nil {
				continue
			}
			n := types.NamespacedName{Namespace: b.Namespace, Name: b.VMIM}
			if !seen[n] {
				seen[n] = true
				out = append(out, reconcile.Request{NamespacedName: n})
			}
		}
		return out
	})
	err = ctrl.NewControllerManagedBy(mgr).
		Named("migration-proxy-bindings").
		For(&kubevirtv1.VirtualMachineInstanceMigration{}, builder.WithPredicates(receiving)).
		WatchesRawSource(source.Kind(c, &corev1.ConfigMap{}, ofEntries)).
		Complete(bc)
	if err != nil {
		return nil, fmt.Errorf("setting up the migration bindings collector: %w", err)
	}
	return held, nil
}

// BindingCollector removes a binding once its receiving VMIM has ended
// (Succeeded or Failed), is being deleted, or is gone, so the ConfigMap
// holds only migrations in flight. It runs on the leader, from the VMIM
// informer: a peer that never comes back does not keep its binding.
type BindingCollector struct {
	Store *store.BindingStore
	// Reader reads VMIMs from the cache; APIReader confirms that a VMIM the
	// cache does not have (or has with another UID) is really gone, since
	// a replica may have bound it from a cache that is ahead of this one.
	Reader, APIReader client.Reader
	Log               logr.Logger
}

// Reconcile implements reconcile.Reconciler for one VMIM.
func (bc *BindingCollector) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	cm, entries, err := bc.Store.Entries(ctx)
	if err != nil || cm == nil {
		return reconcile.Result{}, err
	}
	var mine []string
	for k, b := range entries {
		if b.Namespace == req.Namespace && b.VMIM == req.Name {
			mine = append(mine, k)
		}
	}
	if len(mine) == 0 {
		return reconcile.Result{}, nil
	}
	m, err := bc.migration(ctx, req.NamespacedName, entries[mine[0]].UID)
	if err != nil {
		return reconcile.Result{}, err
	}
	var stale []string
	for _, k := range mine {
		if b := entries[k]; !inFlight(m, b.UID) {
			stale = append(stale, k)
		}
	}
	if len(stale) == 0 {
		return reconcile.Result{}, nil
	}
	if err := bc.Store.Forget(ctx, cm, stale); err != nil {
		if apierrors.IsConflict(err) {
			// Another binding landed meanwhile; decide again on the new
			// ConfigMap once the cache has it.
			return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		return reconcile.Result{}, err
	}
	for _, k := range stale {
		bc.Log.Info("removed the binding of an ended migration", "migrationID", entries[k].MigrationID,
			"peer", entries[k].Peer, "vmim", req.NamespacedName, "uid", entries[k].UID)
	}
	return reconcile.Result{}, nil
}

// migration returns the VMIM (nil when it is gone). The cache answers when
// it has the VMIM with the binding's UID; otherwise the API does.
func (bc *BindingCollector) migration(ctx context.Context, key types.NamespacedName, uid types.UID) (*kubevirtv1.VirtualMachineInstanceMigration, error) {
	var m kubevirtv1.VirtualMachineInstanceMigration
	err := bc.Reader.Get(ctx, key, &m)
	if err == nil && m.UID == uid {
		return &m, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading VirtualMachineInstanceMigration %s: %w", key, err)
	}
	if err := bc.APIReader.Get(ctx, key, &m); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("confirming that VirtualMachineInstanceMigration %s is gone: %w", key, err)
	}
	return &m, nil
}

// inFlight says whether m is the binding's receiving VMIM (same UID) and
// has not ended.
func inFlight(m *kubevirtv1.VirtualMachineInstanceMigration, uid types.UID) bool {
	return m != nil && m.UID == uid && m.Spec.Receive != nil && !m.IsFinal() && m.DeletionTimestamp == nil
}
