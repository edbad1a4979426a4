package lookup_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

func scheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, nadv1.AddToScheme, kubevirtv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestReader(t *testing.T) {
	ctx := context.Background()
	n := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vf", Annotations: map[string]string{"k8s.v1.cni.cncf.io/resourceName": "intel.com/x"}},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"type":"sriov"}`},
	}
	c := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(
		n,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"a": "b"}}},
	).Build()
	r := lookup.NewReader(c)

	info, err := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: "vf"})
	if err != nil || info == nil || info.CNIType != "sriov" || info.ResourceName != "intel.com/x" {
		t.Fatalf("NAD = %+v, %v", info, err)
	}
	again, _ := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: "vf"})
	if again != info {
		t.Error("an unchanged NAD was parsed again")
	}
	// A new resourceVersion is parsed afresh.
	n.Spec.Config = `{"type":"kube-ovn"}`
	if err := c.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	if fresh, _ := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: "vf"}); fresh == info || fresh.CNIType != "kube-ovn" {
		t.Errorf("changed NAD gave %+v", fresh)
	}
	if missing, err := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: "gone"}); missing != nil || err != nil {
		t.Errorf("missing NAD = %v, %v; want nil, nil", missing, err)
	}
	if l, err := r.NamespaceLabels(ctx, "ns"); err != nil || l["a"] != "b" {
		t.Errorf("labels = %v, %v", l, err)
	}
	if l, err := r.NamespaceLabels(ctx, "gone"); err != nil || l != nil {
		t.Errorf("missing namespace = %v, %v", l, err)
	}
	if kv, err := r.KubeVirt(ctx); err != nil || kv != nil {
		t.Errorf("no KubeVirt CR: %v, %v", kv, err)
	}
	if err := c.Create(ctx, &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"}}); err != nil {
		t.Fatal(err)
	}
	if kv, err := r.KubeVirt(ctx); err != nil || kv == nil || kv.Name != "kubevirt" {
		t.Errorf("KubeVirt = %v, %v", kv, err)
	}
}

// A cache failure is kvnet's error and says what was being read.
func TestReaderErrors(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("cache not synced")
	c := fake.NewClientBuilder().WithScheme(scheme(t)).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return boom
		},
		List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return boom },
	}).Build()
	r := lookup.NewReader(c)
	if _, err := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: "vf"}); !errors.Is(err, boom) || !strings.Contains(err.Error(), "ns/vf") {
		t.Errorf("NAD error = %v", err)
	}
	if _, err := r.NamespaceLabels(ctx, "ns"); !errors.Is(err, boom) || !strings.Contains(err.Error(), "namespace ns") {
		t.Errorf("namespace error = %v", err)
	}
	if _, err := r.KubeVirt(ctx); !errors.Is(err, boom) {
		t.Errorf("KubeVirt error = %v", err)
	}
	if _, err := r.PrimaryNetworks(ctx, "ns"); !errors.Is(err, boom) || !strings.Contains(err.Error(), "in ns") {
		t.Errorf("PrimaryNetworks error = %v", err)
	}
}

func TestSnapshot(t *testing.T) {
	kv := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Name: "kv"}}
	s := lookup.NewSnapshot([]nadv1.NetworkAttachmentDefinition{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "x"}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"type":"bridge"}`}},
	}, []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"k": "v"}}}}, kv)
	ctx := context.Background()
	if i, _ := s.NAD(ctx, netattach.Ref{Namespace: "a", Name: "x"}); i == nil || i.CNIType != "bridge" {
		t.Errorf("NAD = %+v", i)
	}
	if i, _ := s.NAD(ctx, netattach.Ref{Namespace: "b", Name: "x"}); i != nil {
		t.Errorf("NAD in another namespace = %+v", i)
	}
	if l, _ := s.NamespaceLabels(ctx, "a"); l["k"] != "v" {
		t.Errorf("labels = %v", l)
	}
	if got, _ := s.KubeVirt(ctx); got != kv {
		t.Errorf("KubeVirt = %v", got)
	}
}

// PrimaryNetworks finds a namespace's OVN-Kubernetes primary UDNs, and only
// those, the same way from the cache and from a snapshot.
func TestPrimaryNetworks(t *testing.T) {
	ctx := context.Background()
	nad := func(ns, name, cfg string) nadv1.NetworkAttachmentDefinition {
		return nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: cfg}}
	}
	nads := []nadv1.NetworkAttachmentDefinition{
		nad("a", "zz-primary", `{"name":"a_zz","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary"}`),
		nad("a", "primary", `{"name":"a_p","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","allowPersistentIPs":true}`),
		nad("a", "secondary", `{"name":"s","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"secondary"}`),
		nad("a", "bridge", `{"name":"b","type":"bridge","role":"primary"}`),
		nad("a", "broken", `{"type":`),
		nad("b", "primary", `{"name":"b_p","type":"ovn-k8s-cni-overlay","topology":"layer3","role":"primary"}`),
	}
	objs := make([]client.Object, len(nads))
	for i := range nads {
		objs[i] = &nads[i]
	}
	facts := map[string]lookup.Facts{
		"reader":   lookup.NewReader(fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(objs...).Build()),
		"snapshot": lookup.NewSnapshot(nads, nil, nil),
	}
	for name, f := range facts {
		t.Run(name, func(t *testing.T) {
			for ns, want := range map[string][]string{"a": {"primary", "zz-primary"}, "b": {"primary"}, "c": nil} {
				got, err := f.PrimaryNetworks(ctx, ns)
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, i := range got {
					if i.Namespace != ns {
						t.Errorf("namespace %s: got %s", ns, i.Ref())
					}
					names = append(names, i.Name)
				}
				if strings.Join(names, ",") != strings.Join(want, ",") {
					t.Errorf("namespace %s: primary networks %v, want %v", ns, names, want)
				}
			}
		})
	}
	r := facts["reader"].(*lookup.Reader)
	first, _ := r.PrimaryNetworks(ctx, "a")
	if again, _ := r.NAD(ctx, netattach.Ref{Namespace: "a", Name: "primary"}); again != first[0] {
		t.Error("a NAD listed for PrimaryNetworks was parsed again by NAD: the memo is not shared")
	}
}

// Reader (through the cache index) and Snapshot (through the index's own
// keys) name the same live holders of a migration ID, in every namespace,
// sorted.
func TestMigrationHolders(t *testing.T) {
	ctx := context.Background()
	mig := func(ns, name, recv string, phase kubevirtv1.VirtualMachineInstanceMigrationPhase) kubevirtv1.VirtualMachineInstanceMigration {
		return kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm", Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: recv}},
			Status:     kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: phase},
		}
	}
	all := []kubevirtv1.VirtualMachineInstanceMigration{
		mig("b", "in", "m1", kubevirtv1.MigrationRunning),
		mig("a", "in", "m1", ""),
		mig("c", "in", "m1", kubevirtv1.MigrationSucceeded),
		mig("a", "other", "m2", kubevirtv1.MigrationRunning),
	}
	b := fake.NewClientBuilder().WithScheme(scheme(t)).WithIndex(&kubevirtv1.VirtualMachineInstanceMigration{}, migrationid.IndexField,
		func(o client.Object) []string {
			return migrationid.Keys(o.(*kubevirtv1.VirtualMachineInstanceMigration))
		})
	for i := range all {
		b = b.WithObjects(all[i].DeepCopy())
	}
	want := []types.NamespacedName{{Namespace: "a", Name: "in"}, {Namespace: "b", Name: "in"}}
	for name, f := range map[string]lookup.Facts{"reader": lookup.NewReader(b.Build()), "snapshot": &lookup.Snapshot{Migrations: all}} {
		got, err := f.MigrationHolders(ctx, migrationid.Receive, "m1")
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: holders of m1 = %v, %v; want %v", name, got, err, want)
		}
		if got, err := f.MigrationHolders(ctx, migrationid.Send, "m1"); err != nil || len(got) != 0 {
			t.Errorf("%s: senders of m1 = %v, %v; want none", name, got, err)
		}
	}
}
