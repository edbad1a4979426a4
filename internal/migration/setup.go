package migration

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/kvnet/kvnet/internal/config"
)

// DefaultNamespace holds the allocations when kvnet is not told its own
// namespace (--namespace or POD_NAMESPACE).
const DefaultNamespace = "kvnet-system"

// Capability is the migration-network machinery of one kvnet process: its
// own informer cache (allocation ConfigMaps in kvnet's namespace, pods that
// carry a reservation label, node metadata), the allocator and pod mutator
// the webhook runs on every replica, and the controller that runs on the
// leader.
type Capability struct {
	Namespace  string
	Cache      cache.Cache
	Allocator  *Allocator
	Mutator    *AddressMutator
	Reconciler *Reconciler
}

// Setup builds the capability on mgr and adds its cache, controller and
// readiness check. The cache is separate from the manager's so that it
// watches only kvnet's objects (not every ConfigMap and pod of the cluster)
// and starts on every replica, leader or not: admission needs it.
func Setup(ctx context.Context, mgr manager.Manager, cfg *config.Source, namespace string) (*Capability, error) {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	c, err := newCache(ctx, mgr, namespace)
	if err != nil {
		return nil, err
	}
	//lint:ignore SA1019 the record API fits events about objects kvnet only references (a pod's DaemonSet or ReplicaSet)
	recorder := mgr.GetEventRecorderFor("kvnet-migration")
	capability := &Capability{Namespace: namespace, Cache: c}
	capability.Allocator = &Allocator{Namespace: namespace, Cache: c, API: mgr.GetAPIReader(), Client: mgr.GetClient()}
	capability.Mutator = &AddressMutator{
		Alloc: capability.Allocator, API: mgr.GetAPIReader(), Recorder: recorder,
		WaitSynced: func(ctx context.Context) bool {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			return c.WaitForCacheSync(ctx)
		},
	}
	capability.Reconciler = &Reconciler{Namespace: namespace, Cache: c, API: mgr.GetAPIReader(), Client: mgr.GetClient(), Config: cfg, Recorder: recorder}
	if err := newController(mgr, c, capability.Reconciler, namespace); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("migration-cache", func(*http.Request) error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return fmt.Errorf("the migration address cache has not synced")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := mgr.Add(&Checker{Reader: mgr.GetAPIReader(), Config: cfg, Log: mgr.GetLogger().WithName("migration-check")}); err != nil {
		return nil, err
	}
	src := &gaugeSource{reader: c, namespace: namespace, config: cfg}
	if err := mgr.Add(everyReplicaFunc(func(ctx context.Context) error { return poolGauges.run(ctx, src) })); err != nil {
		return nil, err
	}
	return capability, nil
}

// newCache is the capability's own cache, added to mgr to run on every
// replica: kvnet's allocation ConfigMaps in namespace, the pods that hold
// a reservation, and Nodes' metadata, with the indexes the allocator and
// the controller look allocations up by (node, reservation token).
func newCache(ctx context.Context, mgr manager.Manager, namespace string) (cache.Cache, error) {
	hasPool, err := labels.NewRequirement(LabelPool, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	hasToken, err := labels.NewRequirement(LabelReservation, selection.Exists, nil)
	if err != nil {
		return nil, err
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{namespace: {}}, Label: labels.NewSelector().Add(*hasPool)},
			&corev1.Pod{}:       {Label: labels.NewSelector().Add(*hasToken)},
		},
		SyncPeriod: ptr.To(10 * time.Minute),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the migration cache: %w", err)
	}
	if err := c.IndexField(ctx, &corev1.ConfigMap{}, indexNode, func(o client.Object) []string {
		cm := o.(*corev1.ConfigMap)
		if n := cm.Data[keyNode]; n != "" {
			return []string{cm.Labels[LabelPool] + "/" + n}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if err := c.IndexField(ctx, &corev1.ConfigMap{}, indexToken, func(o client.Object) []string {
		if t := o.(*corev1.ConfigMap).Data[keyReservation]; t != "" {
			return []string{t}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	for _, obj := range []client.Object{&corev1.ConfigMap{}, &corev1.Pod{}, node} {
		if _, err := c.GetInformer(ctx, obj); err != nil {
			return nil, fmt.Errorf("starting the migration informer for %T: %w", obj, err)
		}
	}
	if err := mgr.Add(everyReplica{c}); err != nil {
		return nil, err
	}
	return c, nil
}

// newController is the allocation controller on cache c: an allocation is
// reconciled when it changes, when a pod holding or reserving its address
// changes, and when its node does.
func newController(mgr manager.Manager, c cache.Cache, r *Reconciler, namespace string) error {
	ctl, err := controller.New("migration-addresses", mgr, controller.Options{
		Reconciler: r, MaxConcurrentReconciles: 4,
		// Tests run two replicas in one process; names are per manager there.
		SkipNameValidation: ptr.To(true),
	})
	if err != nil {
		return err
	}
	node := &metav1.PartialObjectMetadata{}
	node.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	key := func(name string) reconcile.Request {
		return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: name}}
	}
	if err := ctl.Watch(source.Kind(c, &corev1.ConfigMap{}, &handler.TypedEnqueueRequestForObject[*corev1.ConfigMap]{})); err != nil {
		return err
	}
	if err := ctl.Watch(source.Kind(c, &corev1.Pod{}, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, pod *corev1.Pod) []reconcile.Request {
		var out []reconcile.Request
		for _, a := range PodAddresses(pod) {
			out = append(out, key(ObjectName(PoolInCluster, a)), key(ObjectName(PoolCrossCluster, a)))
		}
		var cms corev1.ConfigMapList
		if err := c.List(ctx, &cms, client.InNamespace(namespace), client.MatchingFields{indexToken: pod.Labels[LabelReservation]}); err == nil {
			for _, cm := range cms.Items {
				out = append(out, key(cm.Name))
			}
		}
		return out
	}))); err != nil {
		return err
	}
	if err := ctl.Watch(source.Kind(c, node, handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, n *metav1.PartialObjectMetadata) []reconcile.Request {
		var out []reconcile.Request
		for _, pool := range []string{PoolInCluster, PoolCrossCluster} {
			var cms corev1.ConfigMapList
			if err := c.List(ctx, &cms, client.InNamespace(namespace), client.MatchingFields{indexNode: pool + "/" + n.Name}); err == nil {
				for _, cm := range cms.Items {
					out = append(out, key(cm.Name))
				}
			}
		}
		return out
	}))); err != nil {
		return err
	}
	return nil
}

// everyReplica runs the cache on every replica: a bare cache would land in
// the manager's leader-election group and never start on a follower, whose
// webhook would then wait for it forever.
type everyReplica struct{ cache.Cache }

func (everyReplica) NeedLeaderElection() bool { return false }

// everyReplicaFunc is a function runnable that runs on followers too.
type everyReplicaFunc func(context.Context) error

func (f everyReplicaFunc) Start(ctx context.Context) error { return f(ctx) }

func (everyReplicaFunc) NeedLeaderElection() bool { return false }

// AllocationOf is the allocation of one address, for tests and the CLI.
func AllocationOf(ctx context.Context, r client.Reader, namespace, pool string, a netip.Addr) (*Allocation, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ObjectName(pool, a)}, &cm); err != nil {
		return nil, err
	}
	return FromConfigMap(&cm)
}
