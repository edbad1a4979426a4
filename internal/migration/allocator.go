package migration

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/big"
	"net/http"
	"net/netip"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/model/ippool"
)

// Cache field indexes on allocation ConfigMaps.
const (
	indexNode  = "kvnet.io/migration-node"        // "<pool>/<node>"
	indexToken = "kvnet.io/migration-reservation" // token
)

// maxCreateAttempts bounds how many addresses one admission tries to create
// before it reports contention: each failed attempt means another writer
// took that address a moment earlier.
const maxCreateAttempts = 64

// PoolSpec is a configured pool as the allocator sees it.
type PoolSpec struct {
	// ID is PoolInCluster or PoolCrossCluster.
	ID   string
	Pool *ippool.Pool
	// Field is the config path, for messages: "migration.inCluster.pool".
	Field string
	// Timeout is the reservation timeout.
	Timeout time.Duration
}

// AddressRequest asks for one address for a pod under admission.
type AddressRequest struct {
	Pool PoolSpec
	// Token identifies this admission; the pod carries it in LabelReservation.
	Token string
	// Namespace of the pod.
	Namespace string
	// Node the pod is pinned to, "" if none.
	Node string
}

// Allocator hands out addresses at admission. Reads of the many come from
// Cache; every decision to take an address someone else held is confirmed
// with API, which reads the API server directly, and written with a
// precondition, so a stale cache costs a retry, never a duplicate.
type Allocator struct {
	Namespace string
	Cache     client.Reader
	API       client.Reader
	Client    client.Writer
	// Now is the clock; default time.Now.
	Now func() time.Time

	mu       sync.Mutex
	inflight map[string]bool // object names this process is creating
}

func (al *Allocator) now() time.Time {
	if al.Now != nil {
		return al.Now()
	}
	return time.Now()
}

// ExhaustedError denies a pod: no address of the pool is free.
type ExhaustedError struct {
	Pool    PoolSpec
	Counts  map[State]int
	Message string
}

func (e *ExhaustedError) Error() string { return e.Message }

// Status is the denial as an API status (403, like an exceeded quota); the
// mutator refuses the pod with it (chain.RefuseForbidden).
func (e *ExhaustedError) Status() metav1.Status {
	return metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: e.Message}
}

// Allocate reserves an address for the request: the node's own address if it
// has one whose holder is gone, else a free one, else one whose holder is
// gone; otherwise it returns an *ExhaustedError.
func (al *Allocator) Allocate(ctx context.Context, req AddressRequest) (*Allocation, error) {
	log := logf.FromContext(ctx).WithValues("pool", req.Pool.ID, "node", req.Node)
	if req.Node != "" {
		mine, err := al.list(ctx, al.Cache, req.Pool.ID, client.MatchingFields{indexNode: req.Pool.ID + "/" + req.Node})
		if err != nil {
			return nil, err
		}
		for _, a := range mine {
			if !req.Pool.Pool.Contains(a.Address) {
				continue
			}
			got, err := al.takeOver(ctx, a, req)
			if err != nil {
				return nil, err
			}
			if got != nil {
				log.V(1).Info("reusing the node's address", "address", got.Address)
				return got, nil
			}
		}
	}
	used, err := usedAddresses(ctx, al.Cache, al.Namespace, req.Pool.ID)
	if err != nil {
		return nil, err
	}
	if got, err := al.createFree(ctx, req, used); got != nil || err != nil {
		return got, err
	}
	// The cache says the pool is full. Decide on the API server's word.
	live, err := al.list(ctx, al.API, req.Pool.ID, nil)
	if err != nil {
		return nil, err
	}
	if got, err := al.createFree(ctx, req, usedSet(live)); got != nil || err != nil {
		return got, err
	}
	counts := map[State]int{}
	for _, a := range live {
		counts[a.State]++
		if !req.Pool.Pool.Contains(a.Address) || al.cacheSaysHeld(ctx, a, req.Pool.Timeout) {
			continue // outside the pool since a config edit; or held: only candidates cost an API call
		}
		if a.State == StateIdle && a.Node != "" && a.Node != req.Node {
			// Kept for a node that still exists; steal only a dead node's.
			// A node kvnet cannot check fails the admission as kvnet's
			// error: skipping it could end in an "exhausted" refusal, the
			// user's 403, for what is kvnet's failure to read a node.
			exists, err := al.nodeExists(ctx, a.Node)
			if err != nil {
				return nil, fmt.Errorf("allocating from %s: deciding whether %s, kept for node %s, may be taken over: %w", req.Pool.Field, a.Address, a.Node, err)
			}
			if exists {
				continue
			}
		}
		got, err := al.takeOver(ctx, a, req)
		if err != nil {
			return nil, err
		}
		if got != nil {
			log.Info("took over an address whose holder is gone", "address", got.Address)
			return got, nil
		}
	}
	return nil, exhausted(req.Pool, counts)
}

func exhausted(p PoolSpec, counts map[State]int) *ExhaustedError {
	msg := fmt.Sprintf("%s %s is exhausted: all %s addresses are held (%d by pods, %d reserved for pods being created, %d kept for nodes whose virt-handler is away); free one or widen the pool",
		p.Field, p.Pool, p.Pool.Size(), counts[StateBound], counts[StateReserved], counts[StateIdle])
	return &ExhaustedError{Pool: p, Counts: counts, Message: msg}
}

// Peek says which address Allocate would try first, without writing: for
// dry-run requests.
func (al *Allocator) Peek(ctx context.Context, req AddressRequest) (netip.Addr, bool, error) {
	if req.Node != "" {
		mine, err := al.list(ctx, al.Cache, req.Pool.ID, client.MatchingFields{indexNode: req.Pool.ID + "/" + req.Node})
		if err != nil {
			return netip.Addr{}, false, err
		}
		for _, a := range mine {
			if a.State == StateIdle && req.Pool.Pool.Contains(a.Address) {
				return a.Address, true, nil
			}
		}
	}
	used, err := usedAddresses(ctx, al.Cache, al.Namespace, req.Pool.ID)
	if err != nil {
		return netip.Addr{}, false, err
	}
	var found netip.Addr
	req.Pool.Pool.Walk(startOffset(req.Token), func(a netip.Addr) bool {
		if used[a] {
			return true
		}
		found = a
		return false
	})
	return found, found.IsValid(), nil
}

// createFree walks the pool from an offset derived from the token (so that
// concurrent admissions, in this process or another replica, start at
// different places) and creates the first address no one holds.
func (al *Allocator) createFree(ctx context.Context, req AddressRequest, used map[netip.Addr]bool) (*Allocation, error) {
	var got *Allocation
	var failed error
	attempts := 0
	req.Pool.Pool.Walk(startOffset(req.Token), func(addr netip.Addr) bool {
		if used[addr] {
			return true
		}
		a := &Allocation{
			Pool: req.Pool.ID, Address: addr, PrefixLength: req.Pool.Pool.PrefixBits(addr), State: StateReserved,
			Node: req.Node, Reservation: req.Token, ReservedAt: al.now(), PodNamespace: req.Namespace,
		}
		name := a.Name()
		if !al.claimInflight(name) {
			return true
		}
		defer al.releaseInflight(name)
		attempts++
		cm := a.ToConfigMap(al.Namespace)
		switch err := al.Client.Create(ctx, cm); {
		case err == nil:
			a.CM = cm
			got = a
			return false
		case apierrors.IsAlreadyExists(err):
			if attempts >= maxCreateAttempts {
				failed = fmt.Errorf("allocating from %s: %d addresses taken by concurrent writers in a row; retry", req.Pool.Field, attempts)
				return false
			}
			return true
		default:
			failed = fmt.Errorf("creating allocation %s/%s: %w", al.Namespace, name, err)
			return false
		}
	})
	return got, failed
}

// takeOver reserves an existing allocation for req if its holder is gone.
// nil, nil means it is held (or someone else took it first). A conflict is
// usually the controller releasing the same allocation a moment earlier
// (parking a node's address after its pod went), so takeOver re-reads it
// from the API server and decides again; if the controller deleted it, the
// address is created afresh for this pod.
func (al *Allocator) takeOver(ctx context.Context, a *Allocation, req AddressRequest) (*Allocation, error) {
	for attempt := 0; attempt < 3; attempt++ {
		gone, err := al.holderGone(ctx, a, req.Pool.Timeout)
		if err != nil || !gone {
			return nil, err
		}
		n := *a
		n.State, n.Reservation, n.ReservedAt, n.PodNamespace, n.PodName, n.PodUID = StateReserved, req.Token, al.now(), req.Namespace, "", ""
		if req.Node != "" {
			n.Node = req.Node
		}
		n.PrefixLength = req.Pool.Pool.PrefixBits(a.Address)
		cm := n.ToConfigMap(al.Namespace)
		err = al.Client.Update(ctx, cm)
		if err == nil {
			n.CM = cm
			return &n, nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reserving %s/%s: %w", al.Namespace, cm.Name, err)
		}
		var fresh corev1.ConfigMap
		switch err := al.API.Get(ctx, client.ObjectKey{Namespace: al.Namespace, Name: cm.Name}, &fresh); {
		case apierrors.IsNotFound(err):
			return al.createAt(ctx, req, a.Address)
		case err != nil:
			return nil, fmt.Errorf("re-reading %s/%s: %w", al.Namespace, cm.Name, err)
		}
		if a, err = FromConfigMap(&fresh); err != nil {
			// Edited by hand since the list: left alone, as listAllocations
			// and the controller leave it, since whoever wrote it may use
			// the address. Not an error, since other addresses may be
			// free, but counted and logged: only a person can fix it.
			malformedSkips.WithLabelValues(req.Pool.ID).Inc()
			logf.FromContext(ctx).Error(err, "leaving a malformed allocation alone instead of taking it over; its address stays out of use", "configMap", cm.Name)
			return nil, nil
		}
	}
	return nil, nil
}

// createAt reserves one given address for req; nil, nil if it exists.
func (al *Allocator) createAt(ctx context.Context, req AddressRequest, addr netip.Addr) (*Allocation, error) {
	a := &Allocation{
		Pool: req.Pool.ID, Address: addr, PrefixLength: req.Pool.Pool.PrefixBits(addr), State: StateReserved,
		Node: req.Node, Reservation: req.Token, ReservedAt: al.now(), PodNamespace: req.Namespace,
	}
	cm := a.ToConfigMap(al.Namespace)
	switch err := al.Client.Create(ctx, cm); {
	case err == nil:
		a.CM = cm
		return a, nil
	case apierrors.IsAlreadyExists(err):
		return nil, nil
	default:
		return nil, fmt.Errorf("creating allocation %s/%s: %w", al.Namespace, cm.Name, err)
	}
}

// holderGone decides, on the API server's word, whether an allocation's
// holder can no longer use the address. The caller writes at the
// resourceVersion it read a at, so the answer cannot go stale unnoticed.
func (al *Allocator) holderGone(ctx context.Context, a *Allocation, timeout time.Duration) (bool, error) {
	switch a.State {
	case StateIdle:
		return true, nil
	case StateBound:
		var pod corev1.Pod
		err := al.API.Get(ctx, client.ObjectKey{Namespace: a.PodNamespace, Name: a.PodName}, &pod)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("checking pod %s/%s, holder of %s: %w", a.PodNamespace, a.PodName, a.Address, err)
		}
		return pod.UID != a.PodUID || !Live(&pod), nil
	case StateReserved:
		pods, err := podsWithToken(ctx, al.API, a.PodNamespace, a.Reservation)
		if err != nil {
			return false, err
		}
		return reservationGone(a, pods, al.now(), timeout), nil
	}
	return false, nil
}

// cacheSaysHeld is a cheap first look, from the cache of labelled pods, at
// whether an allocation's holder is live. Only "held" is trusted: "gone" is
// confirmed by holderGone on the API server.
func (al *Allocator) cacheSaysHeld(ctx context.Context, a *Allocation, timeout time.Duration) bool {
	switch a.State {
	case StateBound:
		var pod corev1.Pod
		err := al.Cache.Get(ctx, client.ObjectKey{Namespace: a.PodNamespace, Name: a.PodName}, &pod)
		return err == nil && pod.UID == a.PodUID && Live(&pod)
	case StateReserved:
		pods, err := podsWithToken(ctx, al.Cache, a.PodNamespace, a.Reservation)
		return err == nil && !reservationGone(a, pods, al.now(), timeout)
	}
	return false
}

// reservationGone: the pod that carries the reservation token exists but is
// terminal or asks for another address, or no such pod appeared within the
// timeout (its create failed after admission).
func reservationGone(a *Allocation, pods []corev1.Pod, now time.Time, timeout time.Duration) bool {
	if len(pods) > 0 {
		for i := range pods {
			if Live(&pods[i]) && Holds(&pods[i], a.Address) {
				return false
			}
		}
		return true
	}
	return now.Sub(a.ReservedAt) >= timeout
}

func podsWithToken(ctx context.Context, r client.Reader, namespace, token string) ([]corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{LabelReservation: token}); err != nil {
		return nil, fmt.Errorf("listing pods of reservation %s in %s: %w", token, namespace, err)
	}
	return pods.Items, nil
}

func (al *Allocator) nodeExists(ctx context.Context, node string) (bool, error) {
	var n metav1.PartialObjectMetadata
	n.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	err := al.API.Get(ctx, client.ObjectKey{Name: node}, &n)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking node %s: %w", node, err)
	}
	return true, nil
}

// Rollback undoes a reservation this admission made when a later step
// fails, so nothing is left half-allocated: an address created for it is
// deleted, one taken over goes back to idle for its node.
func (al *Allocator) Rollback(ctx context.Context, a *Allocation) error {
	if a.Node != "" {
		n := *a
		n.State, n.Reservation, n.ReservedAt, n.PodNamespace = StateIdle, "", time.Time{}, ""
		err := al.Client.Update(ctx, n.ToConfigMap(al.Namespace))
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("rolling back %s: %w", a.Name(), err)
	}
	return deleteAllocation(ctx, al.Client, a)
}

func deleteAllocation(ctx context.Context, c client.Writer, a *Allocation) error {
	cm := a.CM
	pre := &client.Preconditions{UID: &cm.UID, ResourceVersion: &cm.ResourceVersion}
	if err := c.Delete(ctx, cm, pre); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("releasing %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return nil
}

// list reads a pool's allocations, skipping (and logging) objects that do
// not parse: a hand-edited ConfigMap must not stop admission, and its name
// still marks the address as used.
func (al *Allocator) list(ctx context.Context, r client.Reader, pool string, fields client.MatchingFields) ([]*Allocation, error) {
	return listAllocations(ctx, r, al.Namespace, pool, fields)
}

func listAllocations(ctx context.Context, r client.Reader, namespace, pool string, fields client.MatchingFields) ([]*Allocation, error) {
	var cms corev1.ConfigMapList
	opts := []client.ListOption{client.InNamespace(namespace)}
	if pool != "" {
		opts = append(opts, client.MatchingLabels{LabelPool: pool})
	} else {
		opts = append(opts, client.HasLabels{LabelPool})
	}
	if fields != nil {
		opts = append(opts, fields)
	}
	if err := r.List(ctx, &cms, opts...); err != nil {
		return nil, fmt.Errorf("listing migration address allocations in %s: %w", namespace, err)
	}
	out := make([]*Allocation, 0, len(cms.Items))
	for i := range cms.Items {
		a, err := FromConfigMap(&cms.Items[i])
		if err != nil {
			logf.FromContext(ctx).Error(err, "ignoring a malformed allocation")
			continue
		}
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address.Less(out[j].Address) })
	return out, nil
}

// usedAddresses is the hot path's view of a pool: only which addresses have
// an object, read from the allocations' data without parsing the rest.
func usedAddresses(ctx context.Context, r client.Reader, namespace, pool string) (map[netip.Addr]bool, error) {
	var cms corev1.ConfigMapList
	if err := r.List(ctx, &cms, client.InNamespace(namespace), client.MatchingLabels{LabelPool: pool}); err != nil {
		return nil, fmt.Errorf("listing migration address allocations in %s: %w", namespace, err)
	}
	used := make(map[netip.Addr]bool, len(cms.Items))
	for i := range cms.Items {
		if a, err := netip.ParseAddr(cms.Items[i].Data[keyAddress]); err == nil {
			used[a] = true
		}
	}
	return used, nil
}

func usedSet(as []*Allocation) map[netip.Addr]bool {
	used := make(map[netip.Addr]bool, len(as))
	for _, a := range as {
		used[a.Address] = true
	}
	return used
}

func startOffset(token string) *big.Int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(token))
	return new(big.Int).SetUint64(h.Sum64())
}

func (al *Allocator) claimInflight(name string) bool {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.inflight == nil {
		al.inflight = map[string]bool{}
	}
	if al.inflight[name] {
		return false
	}
	al.inflight[name] = true
	return true
}

func (al *Allocator) releaseInflight(name string) {
	al.mu.Lock()
	defer al.mu.Unlock()
	delete(al.inflight, name)
}

// errNotSynced is returned when admission runs before the allocation cache
// has synced (a replica that just started).
var errNotSynced = errors.New("kvnet's migration address cache has not synced yet")
