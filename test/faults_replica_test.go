package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/migholders"
	"github.com/kvnet/kvnet/webhook"
)

// faultInstall is a kvnet install of its own for one test: its namespace
// (lease, allocations), its config file, its Service, and replicas that
// serve webhooks. The suite's kvnet keeps running beside it; its config has
// no migration network, so it leaves these pods alone, and its controllers
// watch only their own namespace.
type faultInstall struct {
	t          *testing.T
	namespace  string // kvnet's namespace of this install
	configPath string
	lease      string
	svc        *framework.Service
}

func newFaultInstall(t *testing.T, configYAML string) *faultInstall {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, path, configYAML)
	svc, err := framework.NewService()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	kns := env.NewNamespace(t, nil)
	return &faultInstall{t: t, namespace: kns, configPath: path, lease: kns, svc: svc}
}

// start runs one replica whose client goes through cfg (the API server, or
// an APIProxy in front of it).
func (in *faultInstall) start(cfg *rest.Config, name string) *framework.Replica {
	t := in.t
	t.Helper()
	r, err := framework.StartReplica(cfg, framework.ReplicaOptions{
		ConfigPath: in.configPath, LeaderElectionID: in.lease, Name: name,
		Namespace: in.namespace, CertDir: env.Env.WebhookInstallOptions.LocalServingCertDir,
	})
	if err != nil {
		t.Fatalf("replica %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Errorf("replica %s: %v", name, err)
		}
	})
	return r
}

// registerMigrationPods has the API server call the install's Service for
// virt-handler pods of namespace ns, as the chart's migration-pods webhook
// does. It is named to sort before the suite's own configuration.
func (in *faultInstall) registerMigrationPods(ns string) {
	t := in.t
	t.Helper()
	wio := &env.Env.WebhookInstallOptions
	mwc := &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "a-" + in.namespace},
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name: "migration-pods.mutate.kvnet.io",
			ClientConfig: admissionregv1.WebhookClientConfig{
				URL:      ptr.To("https://" + in.svc.Addr + webhook.PathMutateMigrationPods),
				CABundle: wio.LocalServingCAData,
			},
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"kubevirt.io": "virt-handler"}},
			FailurePolicy:           ptr.To(admissionregv1.Fail),
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNoneOnDryRun),
			TimeoutSeconds:          ptr.To(int32(30)),
			AdmissionReviewVersions: []string{"v1"},
		}},
	}
	if err := env.Client.Create(context.Background(), mwc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mwc) })
}

// waitCalled waits until the API server's calls reach a replica: a dry-run
// virt-handler pod comes back with an address of the pool.
func (in *faultInstall) waitCalled(ds *corev1.Pod, prefix string) {
	t := in.t
	t.Helper()
	framework.Eventually(t, "the API server calling the install's replicas", 60*time.Second, func() error {
		p := ds.DeepCopy()
		if err := env.Client.Create(context.Background(), p, client.DryRunAll); err != nil {
			return err
		}
		if !strings.Contains(p.Annotations[multus.NetworksAnnotation], prefix) {
			return fmt.Errorf("dry-run pod has %s", p.Annotations[multus.NetworksAnnotation])
		}
		return nil
	})
}

func (in *faultInstall) waitLeader(r *framework.Replica, name string) {
	in.t.Helper()
	framework.Eventually(in.t, name+" elected leader", 60*time.Second, func() error {
		if !r.Leader() {
			return fmt.Errorf("%s is not the leader", name)
		}
		return nil
	})
}

// waitOneLeader waits until one of x and y holds the lease and returns it
// first.
func (in *faultInstall) waitOneLeader(x, y *framework.Replica) (leader, follower *framework.Replica) {
	in.t.Helper()
	framework.Eventually(in.t, "a new leader elected", 60*time.Second, func() error {
		switch {
		case x.Leader():
			leader, follower = x, y
		case y.Leader():
			leader, follower = y, x
		default:
			return fmt.Errorf("no leader yet")
		}
		return nil
	})
	return leader, follower
}

// allocations reads the install's allocation table from the API server.
func (in *faultInstall) allocations() ([]*migration.Allocation, error) {
	return migration.ReadTable(context.Background(), env.Client, in.namespace)
}

// boundOneToOne checks that the allocations are exactly one per pod, bound
// to it, with the address the pod carries: no address doubled, none leaked.
func (in *faultInstall) boundOneToOne(pods []*corev1.Pod) error {
	allocs, err := in.allocations()
	if err != nil {
		return err
	}
	want := map[netip.Addr]*corev1.Pod{}
	for _, p := range pods {
		a := podMigrationAddr(p)
		if q := want[a]; q != nil {
			return fmt.Errorf("%s carried by pods %s and %s", a, q.Name, p.Name)
		}
		want[a] = p
	}
	if len(allocs) != len(want) {
		return fmt.Errorf("%d allocations for %d pods: %v", len(allocs), len(want), allocationList(allocs))
	}
	for _, a := range allocs {
		p := want[a.Address]
		if p == nil {
			return fmt.Errorf("allocation %s (%s) belongs to no pod: leaked", a.Address, a.State)
		}
		if a.State != migration.StateBound || a.PodUID != p.UID {
			return fmt.Errorf("allocation %s is %s for %s, pod %s carries it", a.Address, a.State, a.Holder(), p.Name)
		}
	}
	return nil
}

// podMigrationAddr is the pod's migration0 address ("" when it has none).
func podMigrationAddr(p *corev1.Pod) netip.Addr {
	elems, _ := multus.Parse(p.Annotations[multus.NetworksAnnotation])
	for _, e := range elems {
		var ips []string
		if e.Interface() == "migration0" && json.Unmarshal(e.Raw(multus.KeyIPs), &ips) == nil && len(ips) == 1 {
			if pfx, err := netip.ParsePrefix(ips[0]); err == nil {
				return pfx.Addr()
			}
		}
	}
	return netip.Addr{}
}

func inNamespace(ns string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/"+ns+"/configmaps")
	}
}

// The leader replica is killed while it is in the middle of two things: its
// webhook wrote the reservation of a virt-handler pod's address and was
// about to answer the API server, and its controller was about to bind
// another pod's reservation. The first pod's create fails (the webhook call
// broke), the DaemonSet controller's retry goes to the survivor, and the
// survivor, now leader, binds the second pod and releases the orphaned
// reservation. Nothing is left half-done: every allocation bound to the one
// live pod that carries it, no address on two pods, and nothing left once
// the pods and nodes are gone.
func TestReplicaKilledMidAllocation(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	in := newFaultInstall(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.94.0.0/24}
  reservationTimeout: 5s
`, ns))
	proxy, err := framework.NewAPIProxy(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	isCM := inNamespace(in.namespace)
	bindHeld := proxy.HoldBefore(func(r *http.Request) bool { return r.Method == http.MethodPut && isCM(r) })
	createHeld := proxy.HoldAfter(func(r *http.Request) bool { return r.Method == http.MethodPost && isCM(r) })

	a := in.start(proxy.Config, "victim")
	in.waitLeader(a, "victim")
	b := in.start(env.Config, "survivor")
	in.svc.SetEndpoints(b.Addr)
	in.registerMigrationPods(ns)
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	nodes := []string{"kill-n1", "kill-n2"}
	for _, n := range nodes {
		migholders.Node(t, env.Client, n)
	}
	in.waitCalled(migholders.HandlerPod(ds, nodes[0], nil), "10.94.0.")

	// The survivor (a follower) admits p2; the leader's controller goes to
	// bind it, and that write is held.
	p2 := migholders.Create(t, env.Client, migholders.HandlerPod(ds, nodes[1], nil))
	select {
	case what := <-bindHeld.Held:
		t.Logf("held the leader's bind: %s", what)
	case <-time.After(60 * time.Second):
		t.Fatal("the leader never tried to bind the survivor's reservation")
	}
	if alloc, err := migration.AllocationOf(context.Background(), env.Client, in.namespace, migration.PoolInCluster, podMigrationAddr(p2)); err != nil || alloc.State != migration.StateReserved {
		t.Fatalf("before the kill, p2's allocation should still be reserved: %+v, %v", alloc, err)
	}

	// The leader's webhook admits p1: the reservation is written, the
	// answer to the webhook's write is held, so the API server waits.
	in.svc.SetEndpoints(a.Addr)
	p1err := make(chan error, 1)
	go func() { p1err <- env.Client.Create(context.Background(), migholders.HandlerPod(ds, nodes[0], nil)) }()
	select {
	case what := <-createHeld.Held:
		t.Logf("held the leader's reservation write: %s", what)
	case err := <-p1err:
		t.Fatalf("p1 created (%v) without going through the leader's allocation", err)
	case <-time.After(60 * time.Second):
		t.Fatal("the leader's webhook never wrote a reservation")
	}
	allocs, err := in.allocations()
	if err != nil {
		t.Fatal(err)
	}
	orphans := 0
	for _, al := range allocs {
		if al.Node == nodes[0] && al.State == migration.StateReserved {
			orphans++
		}
	}
	if orphans != 1 {
		t.Fatalf("want the killed admission's reservation stored, have %v", allocationList(allocs))
	}

	// Killed: the endpoint goes, the webhook connection breaks, the
	// replica is cut off the API server (it cannot release its lease).
	in.svc.SetEndpoints(b.Addr)
	if err := a.Kill(proxy.Close); err != nil {
		t.Fatalf("killing the leader: %v", err)
	}
	select {
	case err := <-p1err:
		if err == nil {
			t.Fatal("p1 was created although the replica admitting it died before answering")
		}
		t.Logf("p1's create failed as the API server saw the webhook die: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("p1's create did not return after the replica died")
	}
	in.waitLeader(b, "survivor")

	// The DaemonSet controller retries p1; the survivor admits it.
	p1 := migholders.Create(t, env.Client, migholders.HandlerPod(ds, nodes[0], nil))
	pods := []*corev1.Pod{p1, p2}
	t.Cleanup(func() {
		for _, p := range pods {
			migholders.DeletePod(t, env.Client, p)
		}
		for _, n := range nodes {
			migholders.DeleteNode(t, env.Client, n)
		}
		framework.Eventually(t, "every address released once pods and nodes are gone", 60*time.Second, func() error {
			left, err := in.allocations()
			if err == nil && len(left) > 0 {
				err = fmt.Errorf("left: %v", allocationList(left))
			}
			return err
		})
	})
	framework.Eventually(t, "the survivor finished both: every address bound to its one pod", 60*time.Second, func() error {
		return in.boundOneToOne(pods)
	})
	var list corev1.PodList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{"kubevirt.io": "virt-handler"}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(pods) {
		t.Fatalf("%d virt-handler pods stored, want %d: the killed admission's pod must not exist", len(list.Items), len(pods))
	}
}
