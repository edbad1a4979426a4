package test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/migholders"
)

// The lease of kvnet's controllers changes hands twice (replica A, then B,
// stop as in a rolling update; C joins) while VMs on a persistent-IP network
// and virt-handler pods on new nodes keep being created. The persistent-IP
// controller and the migration-address controller run only on the leader,
// so everything created around a hand-over is the next leader's to finish:
// every VM ends with exactly one claim per network and no claim without its
// VM, and every pod's address is bound to it alone. The suite's own kvnet
// is told to leave the namespace alone, so only the install's replicas do
// the work.
func TestLeaderHandoverWhileCreating(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	piPersistentNAD(t, ns, "blue", "blue-net")
	useConfig(t, testConfig+fmt.Sprintf("excludedNamespaces: [kube-system, %s]\n", ns))
	in := newFaultInstall(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.95.0.0/24}
  reservationTimeout: 5s
`, ns))

	a := in.start(env.Config, "a")
	in.waitLeader(a, "a")
	b := in.start(env.Config, "b")
	in.svc.SetEndpoints(a.Addr, b.Addr)
	in.registerMigrationPods(ns)
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	in.waitCalled(migholders.HandlerPod(ds, "probe", nil), "10.95.0.")

	var (
		mu      sync.Mutex
		pods    []*corev1.Pod
		nodes   []string
		loadErr error
		created atomic.Int32
	)
	removeAll := func() {
		for _, p := range pods {
			migholders.DeletePod(t, env.Client, p)
		}
		for _, n := range nodes {
			migholders.DeleteNode(t, env.Client, n)
		}
	}
	t.Cleanup(removeAll) // on failure; the test's end checks the release itself
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if loadErr == nil {
			loadErr = err
		}
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return loadErr
	}
	stop := make(chan struct{})
	var stopOnce sync.Once
	var wg sync.WaitGroup
	stopLoad := func() {
		stopOnce.Do(func() { close(stop) })
		wg.Wait()
	}
	t.Cleanup(stopLoad) // runs first: nothing is created while the cleanup deletes
	wg.Go(func() {
		pace := time.NewTicker(100 * time.Millisecond) // a steady stream, not a busy loop
		defer pace.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-pace.C:
			}
			vm := piVmWithNetworks(ns, fmt.Sprintf("vm-%d", i), [2]string{"blue", "blue"})
			if err := env.Client.Create(ctx, vm); err != nil {
				fail(fmt.Errorf("VM %d: %w", i, err))
				return
			}
			node := fmt.Sprintf("handover-%d", i)
			if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
				fail(err)
				return
			}
			mu.Lock()
			nodes = append(nodes, node)
			mu.Unlock()
			// The DaemonSet controller retries a create its webhook
			// refused, here when it hit a replica that is going away.
			var p *corev1.Pod
			var err error
			for attempt := 0; attempt < 20; attempt++ {
				p = migholders.HandlerPod(ds, node, nil)
				if err = env.Client.Create(ctx, p); err == nil {
					break
				}
			}
			if err != nil {
				fail(fmt.Errorf("virt-handler pod for %s, 20 attempts: %w", node, err))
				return
			}
			mu.Lock()
			pods = append(pods, p)
			mu.Unlock()
			created.Add(1)
		}
	})
	after := func(n int32) {
		t.Helper()
		framework.Eventually(t, fmt.Sprintf("%d VMs and pods created", n), 120*time.Second, func() error {
			if err := failed(); err != nil {
				t.Fatalf("creating: %v", err)
			}
			if got := created.Load(); got < n {
				return fmt.Errorf("%d so far", got)
			}
			return nil
		})
	}

	after(6)
	// Rolling update: a leaves the Service, stops and hands the lease on;
	// c joins, and b or c takes the lease.
	in.svc.SetEndpoints(b.Addr)
	if err := a.Stop(); err != nil {
		t.Fatalf("stopping a: %v", err)
	}
	c := in.start(env.Config, "c")
	in.svc.SetEndpoints(b.Addr, c.Addr)
	leader, follower := in.waitOneLeader(b, c)
	after(12)
	// The new leader goes the same way; the last replica takes over.
	in.svc.SetEndpoints(follower.Addr)
	if err := leader.Stop(); err != nil {
		t.Fatalf("stopping the second leader: %v", err)
	}
	in.waitLeader(follower, "the last replica")
	after(18)
	stopLoad()
	if err := failed(); err != nil {
		t.Fatalf("creating: %v", err)
	}
	t.Logf("%d VMs and virt-handler pods created across two hand-overs", created.Load())

	framework.Eventually(t, "one claim per VM network, none without its VM", 90*time.Second, func() error {
		var vms kubevirtv1.VirtualMachineList
		if err := env.Client.List(ctx, &vms, client.InNamespace(ns)); err != nil {
			return err
		}
		var claims ipamv1alpha1.IPAMClaimList
		if err := env.Client.List(ctx, &claims, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(vms.Items) != int(created.Load()) {
			return fmt.Errorf("%d VMs stored, %d created", len(vms.Items), created.Load())
		}
		return claimsMatchVMs(vms.Items, claims.Items)
	})
	framework.Eventually(t, "every virt-handler's address bound to it alone", 90*time.Second, func() error {
		return in.boundOneToOne(pods)
	})

	// The last leader releases everything once the pods and nodes are gone.
	removeAll()
	framework.Eventually(t, "every address released once pods and nodes are gone", 60*time.Second, func() error {
		left, err := in.allocations()
		if err == nil && len(left) > 0 {
			err = fmt.Errorf("left: %v", allocationList(left))
		}
		return err
	})
}
