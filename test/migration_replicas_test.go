package test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/migholders"
	"github.com/kvnet/kvnet/webhook"
)

// Two kvnet replicas admit 200 virt-handler pods at once. Replica B is a
// second manager with its own webhook server, cache, allocator and
// controller; the API server calls it for half the pods (a configuration
// named to sort before kvnet's, so B runs first and kvnet's replica then
// sees the pod already carries a reservation). No address is given twice,
// every allocation binds to its pod, and when the pods and nodes are gone
// nothing is left.
func TestMigrationTwoReplicasConcurrent(t *testing.T) {
	const pods = 200
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	useConfig(t, fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.92.0.0/24}
`, ns))
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	var calls atomic.Int32
	startReplicaB(t, &calls)

	nodes := make([]string, pods)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("mig-c-%03d", i)
	}
	created := make([]*corev1.Pod, pods)
	t.Cleanup(func() {
		parallel(t, pods, func(i int) error {
			if created[i] != nil {
				if err := env.Client.Delete(context.Background(), created[i]); err != nil && !apierrors.IsNotFound(err) {
					return err
				}
			}
			return client.IgnoreNotFound(env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}}))
		})
		migholders.WaitNoAllocations(t, env.Client, migration.PoolInCluster)
	})
	parallel(t, pods, func(i int) error {
		return env.Client.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[i]}})
	})

	parallel(t, pods, func(i int) error {
		var extra map[string]string
		if i%2 == 0 {
			extra = map[string]string{"kvnet-test/replica": "b"}
		}
		p := migholders.HandlerPod(ds, nodes[i], extra)
		if err := env.Client.Create(context.Background(), p); err != nil {
			return fmt.Errorf("pod for %s: %w", nodes[i], err)
		}
		created[i] = p
		return nil
	})
	if c := calls.Load(); c < pods/2 {
		t.Fatalf("replica B admitted %d pods, want at least %d", c, pods/2)
	}
	owner := map[netip.Addr]int{}
	for i, p := range created {
		a := migholders.Addr(t, p, "migration", "migration0").Addr()
		if j, dup := owner[a]; dup {
			t.Fatalf("%s given to the pods of %s and %s", a, nodes[j], nodes[i])
		}
		owner[a] = i
	}
	framework.Eventually(t, "every allocation bound to its pod", 120*time.Second, func() error {
		allocs := migholders.Allocations(t, env.Client, migration.PoolInCluster)
		if len(allocs) != pods {
			return fmt.Errorf("%d allocations for %d pods", len(allocs), pods)
		}
		for _, a := range allocs {
			i, ok := owner[a.Address]
			if !ok {
				return fmt.Errorf("allocation %s (%s) belongs to no pod: leaked", a.Address, a.State)
			}
			if a.State != migration.StateBound {
				return fmt.Errorf("%s is %s", a.Address, a.State)
			}
			if a.PodUID != created[i].UID || a.Node != nodes[i] {
				t.Fatalf("%s bound to %s on %q, but pod %s on %s asks for it", a.Address, a.Holder(), a.Node, created[i].Name, nodes[i])
			}
		}
		return nil
	})
}

// startReplicaB starts a second kvnet replica (its own manager, webhook
// server, migration cache, allocator and controller) and has the API server
// call it for pods labelled kvnet-test/replica=b.
func startReplicaB(t *testing.T, calls *atomic.Int32) {
	t.Helper()
	wio := &env.Env.WebhookInstallOptions
	port := framework.FreePort(t)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 app.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          ctrlwebhook.NewServer(ctrlwebhook.Options{Host: wio.LocalServingHost, Port: port, CertDir: wio.LocalServingCertDir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := mgr.GetCache().GetInformer(ctx, &nadv1.NetworkAttachmentDefinition{}); err != nil {
		t.Fatal(err)
	}
	capB, err := migration.Setup(ctx, mgr, env.Source, framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	counter := migCountingMutator{calls: calls}
	mgr.GetWebhookServer().Register(webhook.PathMutateMigrationPods, &admission.Webhook{Handler: &webhook.PodMutateHandler{
		Name: "migration-pods-replica-b", Config: env.Source, Facts: lookup.NewReader(mgr.GetCache()),
		Mutators: []chain.PodMutator{capB.Mutator, counter},
	}})
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica B: %v", err)
		}
	})

	mwc := &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "a-kvnet-replica-b"},
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name: "migration-pods.replica-b.kvnet.io",
			ClientConfig: admissionregv1.WebhookClientConfig{
				URL:      ptr.To(fmt.Sprintf("https://%s:%d%s", wio.LocalServingHost, port, webhook.PathMutateMigrationPods)),
				CABundle: wio.LocalServingCAData,
			},
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"kvnet-test/replica": "b", "kubevirt.io": "virt-handler"}},
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
	// Wait until the API server calls B: a dry-run create reaches it.
	framework.Eventually(t, "API server calling replica B", 60*time.Second, func() error {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "probe-", Labels: map[string]string{"kvnet-test/replica": "b", "kubevirt.io": "virt-handler"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		before := calls.Load()
		if err := env.Client.Create(context.Background(), p, client.DryRunAll); err != nil {
			return err
		}
		if calls.Load() == before {
			return errors.New("replica B not called yet")
		}
		return nil
	})
	calls.Store(0)
}

// migCountingMutator counts the pods replica B admitted.
type migCountingMutator struct{ calls *atomic.Int32 }

func (migCountingMutator) Name() string { return "count" }

func (m migCountingMutator) MutatePod(context.Context, *chain.PodRequest) error {
	m.calls.Add(1)
	return nil
}

// parallel runs f for 0..n-1 on 25 goroutines and fails on the first error.
func parallel(t *testing.T, n int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	work := make(chan int)
	for w := 0; w < 25; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d failed; first: %v", len(errs), n, errs[0])
	}
}
