package test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/migholders"
)

// virt-handler pods on N nodes get distinct addresses from the pool; a pod
// recreated on its node gets the node's address back; when the pool is
// exhausted the next pod is denied with the pool and its size, an event on
// the DaemonSet and a metric, and nothing is left half-allocated; a removed
// node's address is released and reused.
func TestMigrationHandlersStickyPerNode(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	useConfig(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool:
      cidr: 10.91.0.0/24
      ranges: [10.91.0.10-10.91.0.14]
      exclude: [10.91.0.12]
`, ns))
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	nodes := []string{"mig-a-1", "mig-a-2", "mig-a-3", "mig-a-4", "mig-a-5"}
	pods := map[string]*corev1.Pod{}
	t.Cleanup(func() {
		for _, p := range pods {
			migholders.DeletePod(t, env.Client, p)
		}
		for _, n := range nodes {
			migholders.DeleteNode(t, env.Client, n)
		}
		migholders.WaitNoAllocations(t, env.Client, migration.PoolInCluster)
	})
	for _, n := range nodes {
		migholders.Node(t, env.Client, n)
	}
	pool := netip.MustParsePrefix("10.91.0.0/24")
	byNode := map[string]netip.Addr{}
	seen := map[netip.Addr]string{}
	for _, n := range nodes[:4] {
		pod := migholders.Create(t, env.Client, migholders.HandlerPod(ds, n, nil))
		pods[n] = pod
		p := migholders.Addr(t, pod, "migration", "migration0")
		if p.Bits() != 24 || !pool.Contains(p.Addr()) || p.Addr() == netip.MustParseAddr("10.91.0.12") {
			t.Fatalf("node %s got %s: want a /24 address of 10.91.0.10-14 other than the excluded .12", n, p)
		}
		if other, dup := seen[p.Addr()]; dup {
			t.Fatalf("nodes %s and %s both got %s", other, n, p.Addr())
		}
		seen[p.Addr()], byNode[n] = n, p.Addr()
		if elems, _ := multus.Parse(pod.Annotations[multus.NetworksAnnotation]); len(elems) != 1 {
			t.Fatalf("virt-operator's element must be completed, not duplicated: %s", pod.Annotations[multus.NetworksAnnotation])
		}
	}
	for _, n := range nodes[:4] {
		migholders.WaitBound(t, env.Client, migration.PoolInCluster, byNode[n], pods[n])
	}

	// Recreated at once (the controller may not have seen the deletion) and
	// again after the controller parked the address: same address both times.
	for round := 0; round < 2; round++ {
		old := pods[nodes[1]]
		migholders.DeletePod(t, env.Client, old)
		if round == 1 {
			framework.Eventually(t, "address parked for its node", 60*time.Second, func() error {
				a, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolInCluster, byNode[nodes[1]])
				if err != nil {
					return err
				}
				if a.State != migration.StateIdle || a.Node != nodes[1] {
					return fmt.Errorf("state %s node %q", a.State, a.Node)
				}
				return nil
			})
		}
		pod := migholders.Create(t, env.Client, migholders.HandlerPod(ds, nodes[1], nil))
		pods[nodes[1]] = pod
		if got := migholders.Addr(t, pod, "migration", "migration0").Addr(); got != byNode[nodes[1]] {
			t.Fatalf("round %d: recreated virt-handler on %s got %s, want its node's %s", round, nodes[1], got, byNode[nodes[1]])
		}
		migholders.WaitBound(t, env.Client, migration.PoolInCluster, byNode[nodes[1]], pod)
	}

	// Exhausted: 4 addresses, 4 nodes; the fifth node's pod is denied.
	before := metricValue(t, "kvnet_migration_denials_total", map[string]string{"pool": "in-cluster", "reason": "exhausted"})
	err := env.Client.Create(context.Background(), migholders.HandlerPod(ds, nodes[4], nil))
	if err == nil {
		t.Fatalf("a fifth virt-handler got an address from a pool of four")
	}
	for _, want := range []string{"migration.inCluster.pool 10.91.0.0/24", "all 4 addresses"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("denial %q does not say %q", err, want)
		}
	}
	if !apierrors.IsForbidden(err) {
		t.Fatalf("denial should be 403 Forbidden (like an exceeded quota), got %v", err)
	}
	if after := metricValue(t, "kvnet_migration_denials_total", map[string]string{"pool": "in-cluster", "reason": "exhausted"}); after != before+1 {
		t.Fatalf("kvnet_migration_denials_total{in-cluster,exhausted} went %v -> %v, want +1", before, after)
	}
	if n := len(migholders.Allocations(t, env.Client, migration.PoolInCluster)); n != 4 {
		t.Fatalf("%d allocations after the denial, want the 4 of the live pods", n)
	}
	if size := metricValue(t, "kvnet_migration_pool_size", map[string]string{"pool": "in-cluster"}); size != 4 {
		t.Fatalf("kvnet_migration_pool_size{in-cluster} = %v, want 4", size)
	}
	framework.Eventually(t, "kvnet_migration_pool_used{in-cluster} = 4", 30*time.Second, func() error {
		if used := metricValue(t, "kvnet_migration_pool_used", map[string]string{"pool": "in-cluster"}); used != 4 {
			return fmt.Errorf("%v", used)
		}
		return nil
	})
	framework.Eventually(t, "MigrationPoolExhausted event on the DaemonSet", 30*time.Second, func() error {
		var evs corev1.EventList
		if err := env.Client.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "MigrationPoolExhausted" && e.InvolvedObject.Kind == "DaemonSet" && e.InvolvedObject.Name == ds.Name {
				return nil
			}
		}
		return fmt.Errorf("none among %d events", len(evs.Items))
	})

	// Node 3 leaves the cluster; PodGC deletes its virt-handler. The address
	// is released and the fifth node gets it.
	gone := byNode[nodes[2]]
	migholders.DeleteNode(t, env.Client, nodes[2])
	migholders.DeletePod(t, env.Client, pods[nodes[2]])
	delete(pods, nodes[2])
	framework.Eventually(t, "removed node's address released", 60*time.Second, func() error {
		_, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolInCluster, gone)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("allocation of %s still there (%v)", gone, err)
	})
	pod := migholders.Create(t, env.Client, migholders.HandlerPod(ds, nodes[4], nil))
	pods[nodes[4]] = pod
	if got := migholders.Addr(t, pod, "migration", "migration0").Addr(); got != gone {
		t.Fatalf("fifth node got %s, want the released %s", got, gone)
	}
	migholders.WaitBound(t, env.Client, migration.PoolInCluster, gone, pod)

	// The operator's table (kvnet migration-ips, run as the CLI is) shows
	// every address with its node and pod.
	out := runCLI(t, "migration-ips", "-n", framework.KvnetNamespace)
	for _, n := range []string{nodes[0], nodes[1], nodes[3], nodes[4]} {
		row := ""
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, " "+n+" ") {
				row = line
			}
		}
		want := []string{"in-cluster", byNodeOr(byNode, n, gone).String() + "/24", "bound", ns + "/virt-handler-"}
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Fatalf("kvnet migration-ips: %s's row %q lacks %q:\n%s", n, row, w, out)
			}
		}
	}
}

// A DaemonSet surge (a second virt-handler admitted on a node while the
// first still runs) gets another address; when the old pod goes, its address
// is released rather than kept as a second one for the node, and the node's
// next virt-handler gets the surviving address.
func TestMigrationHandlerSurgeOnNode(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	useConfig(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.96.0.0/28}
`, ns))
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	const node = "mig-surge-1"
	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			migholders.DeletePod(t, env.Client, p)
		}
		migholders.DeleteNode(t, env.Client, node)
		migholders.WaitNoAllocations(t, env.Client, migration.PoolInCluster)
	})
	migholders.Node(t, env.Client, node)
	old := migholders.Create(t, env.Client, migholders.HandlerPod(ds, node, nil))
	pods = append(pods, old)
	x := migholders.Addr(t, old, "migration", "migration0").Addr()
	migholders.WaitBound(t, env.Client, migration.PoolInCluster, x, old)
	surge := migholders.Create(t, env.Client, migholders.HandlerPod(ds, node, nil))
	pods = append(pods, surge)
	y := migholders.Addr(t, surge, "migration", "migration0").Addr()
	if y == x {
		t.Fatalf("two live virt-handlers on %s share %s", node, x)
	}
	migholders.WaitBound(t, env.Client, migration.PoolInCluster, y, surge)
	migholders.DeletePod(t, env.Client, old)
	framework.Eventually(t, "the old pod's address released, not parked", 60*time.Second, func() error {
		_, err := migration.AllocationOf(context.Background(), env.Client, framework.KvnetNamespace, migration.PoolInCluster, x)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("allocation of %s still there (%v)", x, err)
	})
	migholders.DeletePod(t, env.Client, surge)
	next := migholders.Create(t, env.Client, migholders.HandlerPod(ds, node, nil))
	pods = append(pods, next)
	if got := migholders.Addr(t, next, "migration", "migration0").Addr(); got != y {
		t.Fatalf("next virt-handler on %s got %s, want the node's %s", node, got, y)
	}
}

// A dual-stack-free IPv6 pool works the same; a dry-run create gets an
// address in its answer but reserves nothing.
func TestMigrationIPv6Pool(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	useConfig(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool:
      cidr: fd00:94::/120
      exclude: [fd00:94::1-fd00:94::f]
`, ns))
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	nodes := []string{"mig-v6-1", "mig-v6-2", "mig-v6-3"}
	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			migholders.DeletePod(t, env.Client, p)
		}
		for _, n := range nodes {
			migholders.DeleteNode(t, env.Client, n)
		}
		migholders.WaitNoAllocations(t, env.Client, migration.PoolInCluster)
	})
	pool := netip.MustParsePrefix("fd00:94::/120")
	seen := map[netip.Addr]bool{}
	for _, n := range nodes {
		migholders.Node(t, env.Client, n)
		pod := migholders.Create(t, env.Client, migholders.HandlerPod(ds, n, nil))
		pods = append(pods, pod)
		p := migholders.Addr(t, pod, "migration", "migration0")
		if p.Bits() != 120 || !pool.Contains(p.Addr()) || p.Addr().Less(netip.MustParseAddr("fd00:94::10")) || seen[p.Addr()] {
			t.Fatalf("node %s got %s: want a distinct /120 address of fd00:94::10-ff", n, p)
		}
		seen[p.Addr()] = true
		migholders.WaitBound(t, env.Client, migration.PoolInCluster, p.Addr(), pod)
	}
	dry := migholders.HandlerPod(ds, "mig-v6-dry", nil)
	if err := env.Client.Create(context.Background(), dry, client.DryRunAll); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	if p := migholders.Addr(t, dry, "migration", "migration0"); !pool.Contains(p.Addr()) {
		t.Fatalf("dry run answered %s", p)
	}
	if n := len(migholders.Allocations(t, env.Client, migration.PoolInCluster)); n != len(nodes) {
		t.Fatalf("%d allocations after a dry run, want %d: a dry run must reserve nothing", n, len(nodes))
	}
}

// runCLI runs kvnet with args against the test API server, through a
// kubeconfig file as an operator would, and returns its stdout.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	user, err := env.Env.AddUser(envtest.User{Name: "mig-operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if err := app.Run(context.Background(), append(args, "--kubeconfig", path), strings.NewReader(""), &stdout, &stderr); err != nil {
		t.Fatalf("kvnet %v: %v\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

func byNodeOr(m map[string]netip.Addr, n string, def netip.Addr) netip.Addr {
	if a, ok := m[n]; ok {
		return a
	}
	return def
}
