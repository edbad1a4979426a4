package test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/migholders"
)

// Synchronization controllers (a Deployment: pods without name or node at
// admission) share a list of three addresses with two replicas: a surge of
// one works, the fourth pod waits (denied) until an old one is gone (a
// terminating pod still holds its address), and a reservation whose pod
// failed to create after admission expires. With alsoInCluster each holder
// also gets an in-cluster address, and a denial leaves none behind.
func TestMigrationSyncControllersSurgeAndExpiry(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	env.CreateNAD(t, ns, "crosscluster", "", fmt.Sprintf(bridgeConfig, "crosscluster"))
	useConfig(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  reservationTimeout: 5s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.93.0.0/24}
  crossCluster:
    nad: %[1]s/crosscluster
    addresses: [10.93.1.10/24, 10.93.1.11/24, 10.93.1.12/24]
    alsoInCluster: true
`, ns))
	rs := migholders.SyncReplicaSet(t, env.Client, ns, 2)
	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			var cur corev1.Pod
			if env.Client.Get(context.Background(), client.ObjectKeyFromObject(p), &cur) == nil && len(cur.Finalizers) > 0 {
				cur.Finalizers = nil
				_ = env.Client.Update(context.Background(), &cur)
			}
			migholders.DeletePod(t, env.Client, p)
		}
		migholders.WaitNoAllocations(t, env.Client, migration.PoolCrossCluster)
		migholders.WaitNoAllocations(t, env.Client, migration.PoolInCluster)
	})
	create := func(mod func(*corev1.Pod)) (*corev1.Pod, error) {
		p := migholders.SyncPod(rs)
		if mod != nil {
			mod(p)
		}
		err := env.Client.Create(context.Background(), p)
		if err == nil {
			pods = append(pods, p)
		}
		return p, err
	}
	cc := map[netip.Addr]*corev1.Pod{}
	admit := func(mod func(*corev1.Pod)) *corev1.Pod {
		t.Helper()
		p, err := create(mod)
		if err != nil {
			t.Fatalf("creating a synchronization-controller pod: %v", err)
		}
		a := migholders.Addr(t, p, "crosscluster", "crosscluster0")
		if a.Bits() != 24 || !netip.MustParsePrefix("10.93.1.10/31").Contains(a.Addr()) && a.Addr() != netip.MustParseAddr("10.93.1.12") {
			t.Fatalf("pod got %s, not a listed address", a)
		}
		if other, dup := cc[a.Addr()]; dup {
			t.Fatalf("pods %s and %s both hold %s", other.Name, p.Name, a.Addr())
		}
		cc[a.Addr()] = p
		ic := migholders.Addr(t, p, "migration", "migration0")
		if !netip.MustParsePrefix("10.93.0.0/24").Contains(ic.Addr()) {
			t.Fatalf("alsoInCluster: pod got in-cluster %s", ic)
		}
		migholders.WaitBound(t, env.Client, migration.PoolCrossCluster, a.Addr(), p)
		migholders.WaitBound(t, env.Client, migration.PoolInCluster, ic.Addr(), p)
		return p
	}
	deniedExhausted := func(what string) {
		t.Helper()
		_, err := create(nil)
		if err == nil || !strings.Contains(err.Error(), "migration.crossCluster.addresses 3 listed addresses is exhausted: all 3 addresses") {
			t.Fatalf("%s: want the cross-cluster exhaustion denial, got %v", what, err)
		}
		if n := len(migholders.Allocations(t, env.Client, migration.PoolInCluster)); n != len(cc) {
			t.Fatalf("%s: %d in-cluster allocations for %d live holders: the denied pod's in-cluster reservation was left behind", what, n, len(cc))
		}
	}

	hold := func(p *corev1.Pod) { p.Finalizers = []string{"kvnet.io/test-hold"} }
	old1 := admit(hold)
	old2 := admit(nil)
	surge := admit(nil) // the spare address
	deniedExhausted("a fourth holder")

	// The Deployment controller deletes old1; its finalizer keeps it around
	// (as a kubelet would during the grace period): it still holds its address.
	migholders.DeletePod(t, env.Client, old1)
	deniedExhausted("while the old pod is terminating")
	var cur corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(old1), &cur); err != nil {
		t.Fatal(err)
	}
	cur.Finalizers = nil
	if err := env.Client.Update(context.Background(), &cur); err != nil {
		t.Fatal(err)
	}
	oldAddr := migholders.Addr(t, old1, "crosscluster", "crosscluster0").Addr()
	delete(cc, oldAddr)
	framework.Eventually(t, "the rolled-out pod's address taken by the next new pod", 60*time.Second, func() error {
		p, err := create(nil)
		if err != nil {
			return err
		}
		if got := migholders.Addr(t, p, "crosscluster", "crosscluster0").Addr(); got != oldAddr {
			t.Fatalf("next pod got %s, want the freed %s", got, oldAddr)
		}
		cc[oldAddr] = p
		return nil
	})
	migholders.DeletePod(t, env.Client, old2)
	delete(cc, migholders.Addr(t, old2, "crosscluster", "crosscluster0").Addr())
	_ = surge

	// A create that fails after admission (the pod is invalid: validation
	// runs after mutating admission) leaves a reservation that blocks the
	// spare address until it expires.
	_, err := create(func(p *corev1.Pod) { p.Spec.Containers[0].Image = "" })
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want the invalid pod refused by validation, got %v", err)
	}
	var reserved *migration.Allocation
	for _, a := range migholders.Allocations(t, env.Client, migration.PoolCrossCluster) {
		if a.State == migration.StateReserved {
			reserved = a
		}
	}
	if reserved == nil {
		t.Fatalf("no reservation left by the failed create; allocations: %v", migholders.Allocations(t, env.Client, migration.PoolCrossCluster))
	}
	if _, err := create(nil); err == nil || !strings.Contains(err.Error(), "1 reserved") {
		t.Fatalf("while the failed create's reservation is pending, want a denial that counts it, got %v", err)
	}
	framework.Eventually(t, "failed create's reservation expired", 60*time.Second, func() error {
		_, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolCrossCluster, reserved.Address)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
	p := admit(nil)
	if got := migholders.Addr(t, p, "crosscluster", "crosscluster0").Addr(); got != reserved.Address {
		t.Fatalf("got %s, want the expired reservation's %s", got, reserved.Address)
	}
}
