package test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/migholders"
)

// The attack of issue 27, item 1: a namespace admin copies KubeVirt's
// virt-handler and synchronization-controller pods into its own namespace,
// down to the labels and ServiceAccount names, to drain the migration
// pools. The pools here are exactly as large as the real holders need, so
// a single address taken by a look-alike would leave a real virt-handler
// or synchronization controller without one. Every look-alike is left as
// it was written, counted and logged; the real pods all get their
// addresses.
func TestTenantLookAlikesTakeNoMigrationAddresses(t *testing.T) {
	ctx := context.Background()
	kv := env.NewNamespace(t, nil) // KubeVirt's namespace
	tenant := env.NewNamespace(t, nil)
	env.CreateNAD(t, kv, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	env.CreateNAD(t, kv, "crosscluster", "", fmt.Sprintf(bridgeConfig, "crosscluster"))
	const handlers = 4
	// 4 virt-handlers and 2 synchronization controllers (alsoInCluster)
	// fill the 6 in-cluster addresses; the 2 controllers the 2 cross-cluster ones.
	useConfig(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.97.0.0/24, ranges: [10.97.0.1-10.97.0.6]}
  crossCluster:
    nad: %[1]s/crosscluster
    addresses: [10.97.1.10/24, 10.97.1.11/24]
    alsoInCluster: true
`, kv))
	ds := migholders.HandlerDaemonSet(t, env.Client, kv)
	rs := migholders.SyncReplicaSet(t, env.Client, kv, 2)
	var nodes []string
	var pods []*corev1.Pod
	t.Cleanup(func() {
		for _, p := range pods {
			migholders.DeletePod(t, env.Client, p)
		}
		for _, n := range nodes {
			migholders.DeleteNode(t, env.Client, n)
		}
		migholders.WaitNoAllocations(t, env.Client, migration.PoolInCluster)
		migholders.WaitNoAllocations(t, env.Client, migration.PoolCrossCluster)
	})
	for i := range handlers {
		n := fmt.Sprintf("lookalike-%d", i)
		migholders.Node(t, env.Client, n)
		nodes = append(nodes, n)
	}

	attacker := namespaceAdmin(t, tenant)
	for _, sa := range []string{config.DefaultHandlerServiceAccount, config.DefaultSyncServiceAccount} {
		if err := attacker.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: sa}}); err != nil {
			t.Fatalf("the tenant's ServiceAccount %s: %v", sa, err)
		}
	}
	notHolders := func(reason string) float64 {
		return metricValue(t, "kvnet_migration_not_holder_pods_total", map[string]string{"reason": reason})
	}
	beforeNS, beforeSA := notHolders(config.NotHolderNamespace), notHolders(config.NotHolderServiceAccount)
	logMsg := "left a pod with KubeVirt's migration labels untouched: it is not a migration address holder"
	beforeLogs := env.Logs.Count(logMsg, "namespace", tenant, "reason", config.NotHolderNamespace)

	// The look-alikes: one virt-handler per node and two synchronization
	// controllers, as KubeVirt's controllers would write them, in the
	// tenant's namespace.
	var fakes []*corev1.Pod
	for _, n := range nodes {
		fakes = append(fakes, migholders.HandlerPod(ds, n, nil))
	}
	fakes = append(fakes, migholders.SyncPod(rs), migholders.SyncPod(rs))
	for _, p := range fakes {
		p.Namespace, p.OwnerReferences = tenant, nil
		if err := attacker.Create(ctx, p); err != nil {
			t.Fatalf("the tenant's look-alike %s: %v", p.GenerateName, err)
		}
		pods = append(pods, p)
	}
	// A pod in KubeVirt's namespace under another account (created by
	// whoever may: it still is not virt-handler).
	impostor := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: kv, Name: "impostor"}}
	mustCreate(t, env.Client, impostor)
	wrongSA := migholders.HandlerPod(ds, nodes[0], nil)
	wrongSA.Spec.ServiceAccountName = impostor.Name
	pods = append(pods, migholders.Create(t, env.Client, wrongSA))

	for _, p := range append(fakes, wrongSA) {
		if got := p.Annotations[multus.NetworksAnnotation]; got != migholders.NetworksAnnotation {
			t.Errorf("look-alike %s/%s (account %s) was given migration networks: %s", p.Namespace, p.Name, p.Spec.ServiceAccountName, got)
		}
		if len(p.Spec.Containers) != 1 || len(p.Finalizers) != 0 || p.Labels[migration.LabelReservation] != "" {
			t.Errorf("look-alike %s/%s was changed: %d containers, finalizers %v, labels %v", p.Namespace, p.Name, len(p.Spec.Containers), p.Finalizers, p.Labels)
		}
	}
	if a := migholders.Allocations(t, env.Client, migration.PoolInCluster); len(a) != 0 {
		t.Fatalf("look-alikes hold %d in-cluster addresses", len(a))
	}
	if a := migholders.Allocations(t, env.Client, migration.PoolCrossCluster); len(a) != 0 {
		t.Fatalf("look-alikes hold %d cross-cluster addresses", len(a))
	}
	if d := notHolders(config.NotHolderNamespace) - beforeNS; d != float64(len(fakes)) {
		t.Errorf("kvnet_migration_not_holder_pods_total{reason=namespace} rose by %v, want %d", d, len(fakes))
	}
	if d := notHolders(config.NotHolderServiceAccount) - beforeSA; d != 1 {
		t.Errorf("kvnet_migration_not_holder_pods_total{reason=service-account} rose by %v, want 1", d)
	}
	if d := env.Logs.Count(logMsg, "namespace", tenant, "reason", config.NotHolderNamespace) - beforeLogs; d != len(fakes) {
		t.Errorf("%d log lines name the tenant's look-alikes, want %d", d, len(fakes))
	}

	// The real holders still get every address of the full pools.
	for _, n := range nodes {
		p := migholders.Create(t, env.Client, migholders.HandlerPod(ds, n, nil))
		pods = append(pods, p)
		migholders.Addr(t, p, "migration", "migration0")
	}
	for range 2 {
		p := migholders.Create(t, env.Client, migholders.SyncPod(rs))
		pods = append(pods, p)
		migholders.Addr(t, p, "crosscluster", "crosscluster0")
		migholders.Addr(t, p, "migration", "migration0")
	}
	if a := migholders.Allocations(t, env.Client, migration.PoolInCluster); len(a) != handlers+2 {
		t.Errorf("%d in-cluster allocations for %d real holders", len(a), handlers+2)
	}
}

// namespaceAdmin is a user with a namespace admin's rights on the core
// workload objects of ns, and nothing elsewhere: what a tenant gets. (The
// built-in admin ClusterRole is an aggregation, which needs the
// controller-manager this control plane does not run.)
func namespaceAdmin(t *testing.T, ns string) client.Client {
	t.Helper()
	name := "admin-" + ns
	mustCreate(t, env.Client, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-admin"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "serviceaccounts", "configmaps", "secrets", "services"}, Verbs: []string{"*"}}},
	})
	mustCreate(t, env.Client, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tenant-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
	})
	u, err := env.Env.ControlPlane.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(u.Config(), client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
