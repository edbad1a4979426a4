package lookup

import (
	"context"
	"fmt"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kvnet/kvnet/internal/model/netattach"
)

// The parsed-NAD memo forgets a NAD found deleted and never holds more than
// NADMemoSize entries. (It was an unbounded sync.Map that kept deleted
// NADs: neither check could pass.)
func TestNADMemoEvicts(t *testing.T) {
	s := runtime.NewScheme()
	if err := nadv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).Build()
	r := NewReader(c)
	ctx := context.Background()
	nad := func(i int) *nadv1.NetworkAttachmentDefinition {
		return &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("n%d", i)},
			Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.4.0","type":"bridge"}`}}
	}
	first := nad(0)
	if err := c.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	if info, err := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: "n0"}); err != nil || info == nil {
		t.Fatalf("NAD = %v, %v", info, err)
	}
	if err := c.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	if info, err := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: "n0"}); err != nil || info != nil {
		t.Fatalf("deleted NAD = %v, %v", info, err)
	}
	if n := r.memo().Len(); n != 0 {
		t.Fatalf("memo holds %d entries after the NAD was deleted", n)
	}
	for i := 1; i <= NADMemoSize+10; i++ {
		if err := c.Create(ctx, nad(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := r.NAD(ctx, netattach.Ref{Namespace: "ns", Name: fmt.Sprintf("n%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.memo().Len(); n > NADMemoSize {
		t.Fatalf("memo holds %d entries, bound %d", n, NADMemoSize)
	}
}
