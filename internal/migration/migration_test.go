package migration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/config/configtest"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/multus"
)

const testNS = "kvnet-system"

func mustConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	return configtest.Must(t, y, testNS)
}

const bothNetworks = `
migration:
  inCluster:
    nad: kubevirt/migration
    pool: {cidr: 10.0.0.0/29}
  crossCluster:
    nad: kubevirt/cross
    addresses: [10.1.0.10/24, 10.1.0.11/24]
    alsoInCluster: true
`

// testScheme is built once: building it per fake client would take most
// of FuzzMigrationPods' time.
var testScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	return s
}()

func newFake(t testing.TB, objs ...client.Object) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(testScheme).WithObjects(objs...).
		WithIndex(&corev1.ConfigMap{}, indexNode, func(o client.Object) []string {
			cm := o.(*corev1.ConfigMap)
			if n := cm.Data[keyNode]; n != "" {
				return []string{cm.Labels[LabelPool] + "/" + n}
			}
			return nil
		}).Build()
}

func facts() lookup.Facts {
	return lookup.NewSnapshot([]nadv1.NetworkAttachmentDefinition{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "migration"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "cross"}},
	}, nil, &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"}})
}

func newMutator(c client.Client) *AddressMutator {
	n := 0
	al := &Allocator{Namespace: testNS, Cache: c, API: c, Client: c}
	return &AddressMutator{Alloc: al, API: c, NewToken: func() string { n++; return fmt.Sprintf("token-%d", n) }}
}

func handlerPod(node, networks string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Namespace: "kubevirt", GenerateName: "virt-handler-",
		Labels:      map[string]string{"kubevirt.io": "virt-handler"},
		Annotations: map[string]string{multus.NetworksAnnotation: networks},
	}, Spec: corev1.PodSpec{ServiceAccountName: config.DefaultHandlerServiceAccount}}
	if node != "" {
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}},
		}}}
	}
	return p
}

func syncPod() *corev1.Pod {
	p := handlerPod("", "migration@migration0")
	p.Labels = map[string]string{"kubevirt.io": "virt-synchronization-controller"}
	p.Spec.ServiceAccountName = config.DefaultSyncServiceAccount
	return p
}

func admit(t testing.TB, m *AddressMutator, cfg *config.Config, pod *corev1.Pod) (*chain.PodRequest, error) {
	t.Helper()
	req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: pod.Namespace, Pod: pod, Config: cfg, Facts: facts()}
	return req, m.MutatePod(context.Background(), req)
}

func elements(t testing.TB, pod *corev1.Pod) []map[string]any {
	t.Helper()
	var out []map[string]any
	if err := json.Unmarshal([]byte(pod.Annotations[multus.NetworksAnnotation]), &out); err != nil {
		t.Fatalf("annotation %q: %v", pod.Annotations[multus.NetworksAnnotation], err)
	}
	return out
}

// virt-operator's element is completed in place, other elements and unknown
// keys are kept, and a missing network's element is appended.
func TestMutatorCompletesElements(t *testing.T) {
	cfg := mustConfig(t, bothNetworks)
	tests := map[string]struct {
		pod  *corev1.Pod
		want []map[string]any
	}{
		"virt-operator short form": {
			pod:  handlerPod("n1", "migration@migration0"),
			want: []map[string]any{{"name": "migration", "interface": "migration0", "ips": []any{"10.0.0.x/29"}}},
		},
		"json with other elements and unknown keys": {
			pod: handlerPod("n1", `[{"name":"other","interface":"net1","x-vendor":{"a":1}},{"name":"migration","namespace":"kubevirt","custom":true}]`),
			want: []map[string]any{
				{"name": "other", "interface": "net1", "x-vendor": map[string]any{"a": float64(1)}},
				{"name": "migration", "namespace": "kubevirt", "custom": true, "interface": "migration0", "ips": []any{"10.0.0.x/29"}},
			},
		},
		"no annotation": {
			pod:  handlerPod("n1", ""),
			want: []map[string]any{{"name": "migration", "namespace": "kubevirt", "interface": "migration0", "ips": []any{"10.0.0.x/29"}}},
		},
		"same NAD on another interface is not ours": {
			pod: handlerPod("n1", "migration@other0"),
			want: []map[string]any{
				{"name": "migration", "interface": "other0"},
				{"name": "migration", "namespace": "kubevirt", "interface": "migration0", "ips": []any{"10.0.0.x/29"}},
			},
		},
		"sync controller gets both, cross-cluster appended": {
			pod: syncPod(),
			want: []map[string]any{
				{"name": "migration", "interface": "migration0", "ips": []any{"10.0.0.x/29"}},
				{"name": "cross", "namespace": "kubevirt", "interface": "crosscluster0", "ips": []any{"10.1.0.x/24"}},
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := newMutator(newFake(t))
			if _, err := admit(t, m, cfg, tc.pod); err != nil {
				t.Fatal(err)
			}
			got := elements(t, tc.pod)
			// Addresses depend on the token's offset; compare their shape.
			for _, e := range got {
				if ips, ok := e["ips"].([]any); ok && len(ips) == 1 {
					p := netip.MustParsePrefix(ips[0].(string))
					b := p.Addr().As4()
					e["ips"] = []any{fmt.Sprintf("%d.%d.%d.x/%d", b[0], b[1], b[2], p.Bits())}
				}
			}
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(tc.want)
			if string(gj) != string(wj) {
				t.Fatalf("elements\n got %s\nwant %s", gj, wj)
			}
			if tc.pod.Labels[LabelReservation] == "" {
				t.Fatal("no reservation label")
			}
		})
	}
}

// A cross-cluster pool exhausted after the in-cluster address was reserved
// rolls that reservation back: nothing is left half-allocated.
func TestMutatorRollsBackOnExhaustion(t *testing.T) {
	cfg := mustConfig(t, bothNetworks)
	c := newFake(t)
	m := newMutator(c)
	for i := 0; i < 2; i++ {
		if _, err := admit(t, m, cfg, syncPod()); err != nil {
			t.Fatal(err)
		}
	}
	_, err := admit(t, m, cfg, syncPod())
	if !strings.Contains(err.Error(), "migration.crossCluster.addresses 2 listed addresses is exhausted: all 2 addresses are held (0 by pods, 2 reserved") {
		t.Fatalf("err = %v", err)
	}
	// A full pool is a refusal (403, like an exceeded quota), not kvnet's
	// failure: the webhook answers it as the user's, not as a 500.
	var refusal *chain.Refusal
	if !errors.As(err, &refusal) || refusal.Status().Code != 403 {
		t.Fatalf("the denial must be a 403 chain.Refusal, got %T %v", err, err)
	}
	var cms corev1.ConfigMapList
	if err := c.List(context.Background(), &cms, client.MatchingLabels{LabelPool: PoolInCluster}); err != nil {
		t.Fatal(err)
	}
	if len(cms.Items) != 2 {
		t.Fatalf("%d in-cluster allocations, want 2: the denied pod's was not rolled back", len(cms.Items))
	}
}

func TestMutatorRefusals(t *testing.T) {
	cfg := mustConfig(t, bothNetworks)
	m := newMutator(newFake(t))
	_, err := admit(t, m, cfg, handlerPod("n1", `[{"name":`))
	if !apierrors.IsInvalid(err) {
		t.Fatalf("bad annotation: want 422, got %v", err)
	}
	if se := (&apierrors.StatusError{}); errors.As(err, &se) && se.ErrStatus.Details.Causes[0].Field != "metadata.annotations[k8s.v1.cni.cncf.io/networks]" {
		t.Fatalf("cause field = %q", se.ErrStatus.Details.Causes[0].Field)
	}
	bad := mustConfig(t, strings.ReplaceAll(bothNetworks, "kubevirt/migration", "kubevirt/nope"))
	_, err = admit(t, m, bad, handlerPod("n1", ""))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "migration.inCluster.nad: NetworkAttachmentDefinition kubevirt/nope does not exist") {
		t.Fatalf("missing NAD: got %v", err)
	}
	// Pods no network selects, and UPDATEs, are left alone.
	other := handlerPod("n1", "x@y")
	other.Labels = map[string]string{"app": "other"}
	if _, err := admit(t, m, cfg, other); err != nil || other.Annotations[multus.NetworksAnnotation] != "x@y" {
		t.Fatalf("unselected pod changed: %v %v", err, other.Annotations)
	}
}

// Same node, holder gone: the same address; holder live: another one.
func TestAllocatorNodeStickiness(t *testing.T) {
	cfg := mustConfig(t, bothNetworks)
	c := newFake(t)
	m := newMutator(c)
	addrOf := func(p *corev1.Pod) string { return elements(t, p)[0]["ips"].([]any)[0].(string) }
	p1 := handlerPod("n1", "migration@migration0")
	if _, err := admit(t, m, cfg, p1); err != nil {
		t.Fatal(err)
	}
	// p1 exists: a second pod for n1 while p1 lives gets another address.
	p1.Name = "virt-handler-abc"
	p1.UID = "uid-1"
	if err := c.Create(context.Background(), p1); err != nil {
		t.Fatal(err)
	}
	p2 := handlerPod("n1", "migration@migration0")
	if _, err := admit(t, m, cfg, p2); err != nil {
		t.Fatal(err)
	}
	if addrOf(p1) == addrOf(p2) {
		t.Fatalf("two live pods share %s", addrOf(p1))
	}
	p2.Name, p2.UID = "virt-handler-def", "uid-2"
	if err := c.Create(context.Background(), p2); err != nil {
		t.Fatal(err)
	}
	// p1 is gone (never bound: its reservation's pod no longer exists and
	// the timeout passed): the next pod for n1 takes its address back.
	if err := c.Delete(context.Background(), p1); err != nil {
		t.Fatal(err)
	}
	m.Alloc.Now = func() time.Time { return time.Now().Add(time.Hour) }
	p3 := handlerPod("n1", "migration@migration0")
	if _, err := admit(t, m, cfg, p3); err != nil {
		t.Fatal(err)
	}
	if addrOf(p3) != addrOf(p1) {
		t.Fatalf("recreated pod got %s, want the node's %s", addrOf(p3), addrOf(p1))
	}
}

func TestNodeOf(t *testing.T) {
	if n := NodeOf(handlerPod("node-a", "")); n != "node-a" {
		t.Fatalf("affinity node = %q", n)
	}
	p := handlerPod("", "")
	p.Spec.NodeName = "node-b"
	if n := NodeOf(p); n != "node-b" {
		t.Fatalf("nodeName = %q", n)
	}
	two := handlerPod("node-a", "")
	terms := &two.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	*terms = append(*terms, corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-c"}}}})
	if n := NodeOf(two); n != "" {
		t.Fatalf("two candidate nodes = %q, want unpinned", n)
	}
}

func TestReservationGone(t *testing.T) {
	now := time.Now()
	a := &Allocation{Address: netip.MustParseAddr("10.0.0.1"), ReservedAt: now.Add(-10 * time.Second)}
	holder := handlerPod("", `[{"name":"m","ips":["10.0.0.1/24"]}]`)
	other := handlerPod("", `[{"name":"m","ips":["10.0.0.2/24"]}]`)
	done := holder.DeepCopy()
	done.Status.Phase = corev1.PodSucceeded
	deleting := holder.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	tests := map[string]struct {
		pods    []corev1.Pod
		timeout time.Duration
		want    bool
	}{
		"pod not seen, within timeout":      {timeout: time.Minute, want: false},
		"pod not seen, timed out":           {timeout: time.Second, want: true},
		"pod holds it":                      {pods: []corev1.Pod{*holder}, timeout: time.Second, want: false},
		"pod being deleted still holds it":  {pods: []corev1.Pod{*deleting}, timeout: time.Second, want: false},
		"pod finished":                      {pods: []corev1.Pod{*done}, timeout: time.Minute, want: true},
		"pod of the token asks for another": {pods: []corev1.Pod{*other}, timeout: time.Minute, want: true},
	}
	for name, tc := range tests {
		if got := reservationGone(a, tc.pods, now, tc.timeout); got != tc.want {
			t.Errorf("%s: gone = %v, want %v", name, got, tc.want)
		}
	}
}

func TestAllocationRoundTrip(t *testing.T) {
	for _, s := range []string{"10.0.0.5", "fd00::5"} {
		a := &Allocation{
			Pool: PoolInCluster, Address: netip.MustParseAddr(s), PrefixLength: 24, State: StateBound, Node: "n1",
			Reservation: "tok", ReservedAt: time.Unix(100, 5).UTC(), PodNamespace: "kubevirt", PodName: "p", PodUID: "u",
		}
		cm := a.ToConfigMap(testNS)
		b, err := FromConfigMap(cm)
		if err != nil {
			t.Fatal(err)
		}
		b.CM = nil
		if fmt.Sprint(*a) != fmt.Sprint(*b) {
			t.Fatalf("round trip\n got %+v\nwant %+v", *b, *a)
		}
	}
	if ObjectName(PoolInCluster, netip.MustParseAddr("fd00::1:0")) == ObjectName(PoolInCluster, netip.MustParseAddr("fd00::10")) {
		t.Fatal("two IPv6 addresses share an object name")
	}
	cm := (&Allocation{Pool: PoolInCluster, Address: netip.MustParseAddr("10.0.0.5"), PrefixLength: 24, State: "weird"}).ToConfigMap(testNS)
	if _, err := FromConfigMap(cm); err == nil || !strings.Contains(err.Error(), "data.state") {
		t.Fatalf("bad state accepted: %v", err)
	}
}

// memStore is a stand-in for the informer cache in benchmarks: it lists a
// fixed set of allocations without copying them and accepts every write, so
// the benchmark measures kvnet's own work, not a fake client's JSON round
// trips.
type memStore struct {
	client.Writer
	cms []corev1.ConfigMap
}

func (m *memStore) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
}

func (m *memStore) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	if l, ok := list.(*corev1.ConfigMapList); ok && lo.FieldSelector == nil {
		l.Items = m.cms
	}
	return nil
}

func (m *memStore) Create(context.Context, client.Object, ...client.CreateOption) error { return nil }

// BenchmarkAdmitHandler is the allocation hot path of one virt-handler
// admission: parse the selection, look for the node's address, list the
// pool's 1,000 allocations, pick and "create" a free address in a /16,
// write the element. The API server round trip is not included.
func BenchmarkAdmitHandler(b *testing.B) {
	logf.SetLogger(logr.Discard())
	cfg := mustConfig(b, `
migration:
  inCluster:
    nad: kubevirt/migration
    pool: {cidr: 10.0.0.0/16}
`)
	st := &memStore{}
	pool := cfg.Migration.InCluster.AddressPool()
	pool.Walk(new(big.Int), func(a netip.Addr) bool {
		al := &Allocation{Pool: PoolInCluster, Address: a, PrefixLength: 16, State: StateBound, Node: "n" + a.String(), PodNamespace: "kubevirt", PodName: "p", PodUID: "u"}
		st.cms = append(st.cms, *al.ToConfigMap(testNS))
		return len(st.cms) < 1000
	})
	m := &AddressMutator{Alloc: &Allocator{Namespace: testNS, Cache: st, API: st, Client: st}, API: st}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := admit(b, m, cfg, handlerPod("node-x", "migration@migration0")); err != nil {
			b.Fatal(err)
		}
	}
}

func TestParseObjectName(t *testing.T) {
	for _, s := range []string{"10.0.0.5", "fd00::1:0", "fd00::10", "::"} {
		for _, pool := range []string{PoolInCluster, PoolCrossCluster} {
			a := netip.MustParseAddr(s)
			p, got, ok := ParseObjectName(ObjectName(pool, a))
			if !ok || p != pool || got != a {
				t.Fatalf("%s %s: got %s %s %v", pool, s, p, got, ok)
			}
		}
	}
	for _, bad := range []string{"kvnet-mig-xx-10-0-0-5", "kvnet-mig-ic-10-0-0", "kvnet-mig-ic-10-0-0-500", "other"} {
		if _, _, ok := ParseObjectName(bad); ok {
			t.Fatalf("%q parsed", bad)
		}
	}
}

// An allocation deleted by hand while its pod lives is re-created, bound to
// that pod, in the right pool only.
func TestReconcileAdoptsMissingAllocation(t *testing.T) {
	cfg := mustConfig(t, bothNetworks)
	pod := handlerPod("n1", `[{"name":"migration","namespace":"kubevirt","interface":"migration0","ips":["10.0.0.3/29"]}]`)
	pod.Name, pod.UID = "virt-handler-x", "uid-x"
	pod.Labels[LabelReservation] = "tok"
	c := newFake(t, pod)
	r := &Reconciler{Namespace: testNS, Cache: c, API: c, Client: c, Config: config.Static(cfg)}
	ctx := context.Background()
	addr := netip.MustParseAddr("10.0.0.3")
	for _, pool := range []string{PoolCrossCluster, PoolInCluster} {
		if _, err := r.Reconcile(ctx, reconcileRequest(ObjectName(pool, addr))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := AllocationOf(ctx, c, testNS, PoolCrossCluster, addr); !apierrors.IsNotFound(err) {
		t.Fatalf("an in-cluster address was adopted into the cross-cluster pool: %v", err)
	}
	a, err := AllocationOf(ctx, c, testNS, PoolInCluster, addr)
	if err != nil {
		t.Fatal(err)
	}
	if a.State != StateBound || a.PodUID != "uid-x" || a.Node != "n1" || a.PrefixLength != 29 {
		t.Fatalf("adopted %+v", *a)
	}
}

func reconcileRequest(name string) reconcile.Request {
	return reconcile.Request{NamespacedName: client.ObjectKey{Namespace: testNS, Name: name}}
}

// A pod arriving with a reservation label keeps its address only when the
// reservation is pending under that token and no pod carries the token yet
// (a second replica's webhook after the first); a copy of an existing pod's
// manifest gets an address of its own.
func TestMutatorKeepsOnlyAPendingReservation(t *testing.T) {
	cfg := mustConfig(t, bothNetworks)
	c := newFake(t)
	m := newMutator(c)
	first := handlerPod("n1", "migration@migration0")
	if _, err := admit(t, m, cfg, first); err != nil {
		t.Fatal(err)
	}
	again := first.DeepCopy()
	if _, err := admit(t, m, cfg, again); err != nil {
		t.Fatal(err)
	}
	if again.Annotations[multus.NetworksAnnotation] != first.Annotations[multus.NetworksAnnotation] || again.Labels[LabelReservation] != first.Labels[LabelReservation] {
		t.Fatalf("second webhook changed a pending reservation: %v -> %v", first.Annotations, again.Annotations)
	}
	first.Name, first.UID = "virt-handler-a", "uid-a"
	if err := c.Create(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	copied := first.DeepCopy()
	copied.Name, copied.UID, copied.ResourceVersion = "", "", ""
	if _, err := admit(t, m, cfg, copied); err != nil {
		t.Fatal(err)
	}
	if copied.Labels[LabelReservation] == first.Labels[LabelReservation] || copied.Annotations[multus.NetworksAnnotation] == first.Annotations[multus.NetworksAnnotation] {
		t.Fatalf("a copied manifest kept the original pod's address: %s", copied.Annotations[multus.NetworksAnnotation])
	}
}
