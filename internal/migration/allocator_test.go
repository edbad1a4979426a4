package migration

import (
	"context"
	"errors"
	"math/big"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kvnet/kvnet/internal/chain"
)

// inClusterSpec is the in-cluster pool of bothNetworks.
func inClusterSpec(t *testing.T) PoolSpec {
	t.Helper()
	return inClusterNetwork(&mustConfig(t, bothNetworks).Migration).Pool
}

// putIdle stores an idle in-cluster allocation of addr kept for node.
func putIdle(t *testing.T, c client.Client, p PoolSpec, addr netip.Addr, node string) {
	t.Helper()
	a := &Allocation{Pool: p.ID, Address: addr, PrefixLength: p.Pool.PrefixBits(addr), State: StateIdle, Node: node}
	if err := c.Create(context.Background(), a.ToConfigMap(testNS)); err != nil {
		t.Fatal(err)
	}
}

// inClusterAllocations reads the stored in-cluster allocations by address.
func inClusterAllocations(t *testing.T, c client.Reader) map[netip.Addr]*Allocation {
	t.Helper()
	all, err := listAllocations(context.Background(), c, testNS, PoolInCluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[netip.Addr]*Allocation{}
	for _, a := range all {
		out[a.Address] = a
	}
	return out
}

// When the pool is full and the only candidates are addresses kept for
// another node, the allocator asks the API server whether that node still
// exists. If it cannot tell, the admission fails as kvnet's own error (the
// webhook's 500, retried by the DaemonSet controller), naming the node,
// rather than skipping every candidate and refusing the pod with a 403
// "pool exhausted" that is not true; and no allocation changes hands.
// With the node known to be gone, the same request takes one over: the
// failure was the check, not the pool.
func TestAllocatorFailsClosedWhenANodeCannotBeChecked(t *testing.T) {
	cfg := mustConfig(t, bothNetworks)
	p := inClusterSpec(t)
	c := newFake(t).(client.WithWatch)
	p.Pool.Walk(big.NewInt(0), func(addr netip.Addr) bool {
		putIdle(t, c, p, addr, "n-other")
		return true
	})
	nodesFail := interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok && m.Kind == "Node" {
				return apierrors.NewServiceUnavailable("the API server is overloaded")
			}
			return cl.Get(ctx, key, obj, opts...)
		},
	})
	m := newMutator(c)
	m.Alloc.API = nodesFail
	before := inClusterAllocations(t, c)

	_, err := admit(t, m, cfg, handlerPod("n1", "migration@migration0"))
	var refusal *chain.Refusal
	var ex *ExhaustedError
	if err == nil || errors.As(err, &refusal) || errors.As(err, &ex) {
		t.Fatalf("err = %v (%T), want kvnet's own error, not a refusal", err, err)
	}
	if !strings.Contains(err.Error(), "checking node n-other") || !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("err = %v, want it to name the node check and wrap the API error", err)
	}
	after := inClusterAllocations(t, c)
	if len(after) != len(before) {
		t.Fatalf("%d allocations after the failure, want %d", len(after), len(before))
	}
	for addr, a := range after {
		if a.State != StateIdle || a.Node != "n-other" || a.Reservation != "" {
			t.Fatalf("%s changed on a failed admission: %+v", addr, a)
		}
	}

	m.Alloc.API = c // no Node object: n-other is gone
	if _, err := admit(t, m, cfg, handlerPod("n1", "migration@migration0")); err != nil {
		t.Fatalf("with n-other gone: %v", err)
	}
	taken := 0
	for _, a := range inClusterAllocations(t, c) {
		if a.State == StateReserved && a.Node == "n1" {
			taken++
		}
	}
	if taken != 1 {
		t.Fatalf("%d addresses reserved for n1, want 1 taken over from n-other", taken)
	}
}

// A take-over that loses a race re-reads the allocation; if it no longer
// parses (edited by hand in between), the allocator leaves it alone, as
// the list and the controller do, since whoever wrote it may use the
// address: it is neither overwritten nor handed out. That decision is
// counted in kvnet_migration_malformed_allocations_skipped_total and logged
// with the ConfigMap's name, and the pod gets another, free address.
func TestAllocatorCountsAMalformedAllocationItPassesOver(t *testing.T) {
	p := inClusterSpec(t)
	c := newFake(t).(client.WithWatch)
	mine := netip.MustParseAddr("10.0.0.1")
	putIdle(t, c, p, mine, "n1")
	name := ObjectName(PoolInCluster, mine)
	// The first write to the node's allocation finds it changed: someone
	// stored a state kvnet does not know.
	raced := false
	writer := interceptor.NewClient(c, interceptor.Funcs{
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if obj.GetName() != name || raced {
				return cl.Update(ctx, obj, opts...)
			}
			raced = true
			var cm corev1.ConfigMap
			if err := cl.Get(ctx, client.ObjectKey{Namespace: testNS, Name: name}, &cm); err != nil {
				return err
			}
			cm.Data[keyState] = "handed-to-team-b"
			if err := cl.Update(ctx, &cm); err != nil {
				return err
			}
			return apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, name, errors.New("the object has been modified"))
		},
	})
	al := &Allocator{Namespace: testNS, Cache: c, API: c, Client: writer}
	var lines []string
	ctx := logr.NewContext(context.Background(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}))
	skipped := testutil.ToFloat64(malformedSkips.WithLabelValues(PoolInCluster))

	got, err := al.Allocate(ctx, AddressRequest{Pool: p, Token: "t1", Namespace: "kubevirt", Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	if !raced {
		t.Fatal("the take-over of the node's address never wrote it; the test does not reach the re-read")
	}
	if got.Address == mine {
		t.Fatalf("got %s, the malformed allocation's address", got.Address)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: testNS, Name: name}, &cm); err != nil || cm.Data[keyState] != "handed-to-team-b" {
		t.Fatalf("the malformed allocation was overwritten or lost: %v %v", err, cm.Data)
	}
	if d := testutil.ToFloat64(malformedSkips.WithLabelValues(PoolInCluster)) - skipped; d != 1 {
		t.Fatalf("kvnet_migration_malformed_allocations_skipped_total{pool=%q} rose by %v, want 1", PoolInCluster, d)
	}
	logged := false
	for _, l := range lines {
		logged = logged || (strings.Contains(l, name) && strings.Contains(l, "handed-to-team-b"))
	}
	if !logged {
		t.Fatalf("no log line names %s and what is wrong with it: %q", name, lines)
	}
}
