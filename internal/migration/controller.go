package migration

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kvnet/kvnet/internal/config"
)

// Reconciler keeps allocations true to the pods: it binds a reservation to
// the pod that carries its token once the pod exists, and releases
// allocations whose pod is gone or terminal, or whose pod never appeared
// within the reservation timeout. In-cluster allocations of a node go idle
// instead, so the node's next virt-handler gets the same address; they are
// deleted when the node is. Every write carries the resourceVersion the
// decision was made on, so it is safe next to admission on any replica, and
// next to a second controller.
type Reconciler struct {
	Namespace string
	// Cache is the informer-backed reader of allocations, pods and nodes.
	Cache client.Reader
	// API reads the API server directly: every release is confirmed there.
	API      client.Reader
	Client   client.Writer
	Config   *config.Source
	Recorder record.EventRecorder
	Now      func() time.Time
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile implements reconcile.Reconciler for one allocation ConfigMap.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	log := logf.FromContext(ctx).WithValues("allocation", req.Name)
	var cm corev1.ConfigMap
	if err := r.Cache.Get(ctx, req.NamespacedName, &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, r.adopt(ctx, req.Name)
		}
		return reconcile.Result{}, err
	}
	a, err := FromConfigMap(&cm)
	if err != nil {
		log.Error(err, "leaving a malformed allocation alone; its address stays out of use")
		return reconcile.Result{}, nil
	}
	cfg := r.Config.Get()
	timeout := config.DefaultReservationTimeout
	if cfg != nil {
		timeout = cfg.Migration.Timeout()
	}
	switch a.State {
	case StateReserved:
		return r.reserved(ctx, a, timeout)
	case StateBound:
		return reconcile.Result{}, r.bound(ctx, a)
	case StateIdle:
		return reconcile.Result{}, r.idle(ctx, a)
	}
	return reconcile.Result{}, nil
}

func (r *Reconciler) reserved(ctx context.Context, a *Allocation, timeout time.Duration) (reconcile.Result, error) {
	pods, err := podsWithToken(ctx, r.Cache, a.PodNamespace, a.Reservation)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(pods) == 0 {
		if age := r.now().Sub(a.ReservedAt); age < timeout {
			return reconcile.Result{RequeueAfter: timeout - age + 100*time.Millisecond}, nil
		}
		// The cache may lag: ask the API server before releasing.
		if pods, err = podsWithToken(ctx, r.API, a.PodNamespace, a.Reservation); err != nil {
			return reconcile.Result{}, err
		}
		if len(pods) == 0 {
			return reconcile.Result{}, r.release(ctx, a, "reservation-expired")
		}
	}
	for i := range pods {
		if Live(&pods[i]) && Holds(&pods[i], a.Address) {
			return reconcile.Result{}, r.bind(ctx, a, &pods[i])
		}
	}
	// The pod of this admission exists without this address (an admission
	// retried after this reservation was made) or has finished.
	return reconcile.Result{}, r.release(ctx, a, "pod-gone")
}

func (r *Reconciler) bind(ctx context.Context, a *Allocation, pod *corev1.Pod) error {
	n := *a
	n.State, n.PodName, n.PodUID = StateBound, pod.Name, pod.UID
	if err := r.Client.Update(ctx, n.ToConfigMap(r.Namespace)); err != nil {
		return ignoreRace(err)
	}
	logf.FromContext(ctx).V(1).Info("bound", "address", a.Address, "pod", pod.Namespace+"/"+pod.Name)
	return nil
}

func (r *Reconciler) bound(ctx context.Context, a *Allocation) error {
	var pod corev1.Pod
	err := r.Cache.Get(ctx, client.ObjectKey{Namespace: a.PodNamespace, Name: a.PodName}, &pod)
	if err == nil && pod.UID == a.PodUID && Live(&pod) {
		return nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = r.API.Get(ctx, client.ObjectKey{Namespace: a.PodNamespace, Name: a.PodName}, &pod)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("checking pod %s/%s: %w", a.PodNamespace, a.PodName, err)
	case pod.UID == a.PodUID && Live(&pod):
		return nil // the cache lags
	}
	return r.release(ctx, a, "pod-gone")
}

func (r *Reconciler) idle(ctx context.Context, a *Allocation) error {
	if !r.inPool(a) {
		return r.remove(ctx, a, "outside-pool")
	}
	exists, err := r.nodeExists(ctx, a.Node)
	if err != nil {
		return err
	}
	if !exists {
		return r.remove(ctx, a, "node-gone")
	}
	others, err := listAllocations(ctx, r.Cache, r.Namespace, a.Pool, client.MatchingFields{indexNode: a.Pool + "/" + a.Node})
	if err != nil {
		return err
	}
	for _, o := range others {
		if o.Address != a.Address && o.State != StateIdle {
			// The node's pod got another address (its old one was still
			// held when it was admitted): keep that one, free this.
			return r.remove(ctx, a, "surplus")
		}
	}
	return nil
}

// release frees an allocation whose holder is gone: idle if it belongs to a
// node that exists and has no other address, deleted otherwise.
func (r *Reconciler) release(ctx context.Context, a *Allocation, reason string) error {
	if a.Node != "" && r.inPool(a) {
		exists, err := r.nodeExists(ctx, a.Node)
		if err != nil {
			return err
		}
		others, err := listAllocations(ctx, r.Cache, r.Namespace, a.Pool, client.MatchingFields{indexNode: a.Pool + "/" + a.Node})
		if err != nil {
			return err
		}
		alone := true
		for _, o := range others {
			if o.Address != a.Address && o.State != StateIdle {
				alone = false
			}
		}
		if exists && alone {
			n := *a
			n.State, n.Reservation, n.ReservedAt, n.PodNamespace, n.PodName, n.PodUID = StateIdle, "", time.Time{}, "", "", ""
			if err := r.Client.Update(ctx, n.ToConfigMap(r.Namespace)); err != nil {
				return ignoreRace(err)
			}
			releases.WithLabelValues(a.Pool, reason).Inc()
			logf.FromContext(ctx).Info("address kept for its node", "address", a.Address, "node", a.Node, "reason", reason)
			return nil
		}
	}
	return r.remove(ctx, a, reason)
}

func (r *Reconciler) remove(ctx context.Context, a *Allocation, reason string) error {
	if err := deleteAllocation(ctx, r.Client, a); err != nil {
		return ignoreRace(err)
	}
	releases.WithLabelValues(a.Pool, reason).Inc()
	logf.FromContext(ctx).Info("address released", "address", a.Address, "pool", a.Pool, "reason", reason, "holder", a.Holder())
	return nil
}

func (r *Reconciler) inPool(a *Allocation) bool {
	cfg := r.Config.Get()
	if cfg == nil {
		return false
	}
	switch {
	case a.Pool == PoolInCluster && cfg.Migration.InCluster != nil:
		return inClusterNetwork(&cfg.Migration).Pool.Pool.Contains(a.Address)
	case a.Pool == PoolCrossCluster && cfg.Migration.CrossCluster != nil:
		return crossClusterNetwork(&cfg.Migration).Pool.Pool.Contains(a.Address)
	}
	return false
}

func (r *Reconciler) nodeExists(ctx context.Context, node string) (bool, error) {
	var n metav1.PartialObjectMetadata
	n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	if err := r.Cache.Get(ctx, client.ObjectKey{Name: node}, &n); err == nil {
		return true, nil
	} else if !apierrors.IsNotFound(err) {
		return false, err
	}
	err := r.API.Get(ctx, client.ObjectKey{Name: node}, &n)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking node %s: %w", node, err)
	}
	return true, nil
}

// ignoreRace drops the errors of losing a race: the object changed or went
// away since it was read, and its new state brings its own event.
func ignoreRace(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// adopt recreates the allocation of an address that a live pod carries but
// that has no object (deleted by hand, or lost with a namespace): without it
// the address would look free and could be given to a second pod.
func (r *Reconciler) adopt(ctx context.Context, name string) error {
	pool, addr, ok := ParseObjectName(name)
	if !ok || !r.inPool(&Allocation{Pool: pool, Address: addr}) {
		return nil // pod events enqueue both pools' names; only one is real
	}
	var pods corev1.PodList
	if err := r.Cache.List(ctx, &pods, client.HasLabels{LabelReservation}); err != nil {
		return err
	}
	var holders []*corev1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; Live(p) && Holds(p, addr) {
			holders = append(holders, p)
		}
	}
	if len(holders) == 0 {
		return nil
	}
	// Confirm on the API server: the object may exist and the cache lag.
	var cm corev1.ConfigMap
	if err := r.API.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &cm); err == nil || !apierrors.IsNotFound(err) {
		return client.IgnoreNotFound(err)
	}
	p := holders[0]
	if len(holders) > 1 && r.Recorder != nil {
		for _, h := range holders {
			r.Recorder.Eventf(h, corev1.EventTypeWarning, "MigrationAddressConflict", "%d live pods carry migration address %s; kvnet records %s/%s as its holder", len(holders), addr, p.Namespace, p.Name)
		}
	}
	bits := addr.BitLen()
	for _, e := range PodPrefixes(p) {
		if e.Addr() == addr {
			bits = e.Bits()
		}
	}
	a := &Allocation{
		Pool: pool, Address: addr, PrefixLength: bits, State: StateBound,
		Reservation: p.Labels[LabelReservation], PodNamespace: p.Namespace, PodName: p.Name, PodUID: p.UID,
	}
	if pool == PoolInCluster {
		a.Node = NodeOf(p)
	}
	if err := r.Client.Create(ctx, a.ToConfigMap(r.Namespace)); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("re-creating the allocation of %s held by %s/%s: %w", addr, p.Namespace, p.Name, err)
	}
	logf.FromContext(ctx).Info("re-created a missing allocation for the pod that holds it", "address", addr, "pod", p.Namespace+"/"+p.Name)
	return nil
}
