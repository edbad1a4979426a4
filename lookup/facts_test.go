package lookup_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kvnet/kvnet/lookup"
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

	info, err := r.NAD(ctx, "ns", "vf")
	if err != nil || info == nil || info.CNIType != "sriov" || info.ResourceName != "intel.com/x" {
		t.Fatalf("NAD = %+v, %v", info, err)
	}
	again, _ := r.NAD(ctx, "ns", "vf")
	if again != info {
		t.Error("an unchanged NAD was parsed again")
	}
	// A new resourceVersion is parsed afresh.
	n.Spec.Config = `{"type":"kube-ovn"}`
	if err := c.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	if fresh, _ := r.NAD(ctx, "ns", "vf"); fresh == info || fresh.CNIType != "kube-ovn" {
		t.Errorf("changed NAD gave %+v", fresh)
	}
	if missing, err := r.NAD(ctx, "ns", "gone"); missing != nil || err != nil {
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
	if _, err := r.NAD(ctx, "ns", "vf"); !errors.Is(err, boom) || !strings.Contains(err.Error(), "ns/vf") {
		t.Errorf("NAD error = %v", err)
	}
	if _, err := r.NamespaceLabels(ctx, "ns"); !errors.Is(err, boom) || !strings.Contains(err.Error(), "namespace ns") {
		t.Errorf("namespace error = %v", err)
	}
	if _, err := r.KubeVirt(ctx); !errors.Is(err, boom) {
		t.Errorf("KubeVirt error = %v", err)
	}
}

func TestSnapshot(t *testing.T) {
	kv := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Name: "kv"}}
	s := lookup.NewSnapshot([]nadv1.NetworkAttachmentDefinition{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "x"}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"type":"bridge"}`}},
	}, []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"k": "v"}}}}, kv)
	ctx := context.Background()
	if i, _ := s.NAD(ctx, "a", "x"); i == nil || i.CNIType != "bridge" {
		t.Errorf("NAD = %+v", i)
	}
	if i, _ := s.NAD(ctx, "b", "x"); i != nil {
		t.Errorf("NAD in another namespace = %+v", i)
	}
	if l, _ := s.NamespaceLabels(ctx, "a"); l["k"] != "v" {
		t.Errorf("labels = %v", l)
	}
	if got, _ := s.KubeVirt(ctx); got != kv {
		t.Errorf("KubeVirt = %v", got)
	}
}
