package main

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
)

// A launcher pod's selection prints one element a line, keys in their
// order, strings unquoted and lists as JSON; the short form works too.
func TestFormatElements(t *testing.T) {
	got, err := formatElements(`[{"name":"storage","namespace":"tenant-a","interface":"pod49a25f9feef"},` +
		`{"name":"tenant-l2","namespace":"tenant-a","interface":"pode9da86d351c","ipam-claim-reference":"web.tenant"},` +
		`{"name":"migration-net","interface":"migration0","ips":["10.210.0.10/24"]}]`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"tenant-a/storage  interface=pod49a25f9feef",
		"tenant-a/tenant-l2  interface=pode9da86d351c  ipam-claim-reference=web.tenant",
		`migration-net  interface=migration0  ips=["10.210.0.10/24"]`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got, err := formatElements("kubevirt/migration-net@migration0"); err != nil || !reflect.DeepEqual(got, []string{"kubevirt/migration-net  interface=migration0"}) {
		t.Errorf("short form: %q, %v", got, err)
	}
	if _, err := formatElements(`[{"name":`); err == nil {
		t.Error("a broken annotation must be an error")
	}
}

func TestFormatClaimAndAllocation(t *testing.T) {
	claim := &ipamv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "web.tenant", UID: "u1", Finalizers: []string{"kvnet.io/persistent-ip"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "VirtualMachine", Name: "web", Controller: ptr.To(true)}}},
		Spec: ipamv1alpha1.IPAMClaimSpec{Network: "tenant-a-l2", Interface: "pode9da86d351c"},
	}
	want := "IPAMClaim tenant-a/web.tenant  network=tenant-a-l2  interface=pode9da86d351c  owner VirtualMachine/web  finalizers=[kvnet.io/persistent-ip]  uid=u1"
	if got := formatClaim(claim); got != want {
		t.Errorf("formatClaim:\n got %s\nwant %s", got, want)
	}
	a := &migration.Allocation{Pool: migration.PoolInCluster, Address: netip.MustParseAddr("10.210.0.10"), PrefixLength: 24,
		State: migration.StateBound, Node: "node1", PodNamespace: "kubevirt", PodName: "virt-handler-x"}
	a.CM = a.ToConfigMap("kvnet-system")
	want = "ConfigMap kvnet-system/kvnet-mig-ic-10-210-0-10  pool=in-cluster  address=10.210.0.10/24  state=bound  node=node1  pod=kubevirt/virt-handler-x"
	if got := formatAllocation(a); got != want {
		t.Errorf("formatAllocation:\n got %s\nwant %s", got, want)
	}
}

// The virt-handler step accepts exactly one address of the pool on the
// migration interface of the migration NAD.
func TestMigrationAddress(t *testing.T) {
	pool := netip.MustParsePrefix("10.210.0.0/24")
	pod := func(ann string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "virt-handler-x", Annotations: map[string]string{multus.NetworksAnnotation: ann}}}
	}
	got, err := migrationAddress(pod(`[{"name":"migration-net","interface":"migration0","ips":["10.210.0.135/24"]}]`), "kubevirt", "migration-net", "migration0", pool)
	if err != nil || got != netip.MustParsePrefix("10.210.0.135/24") {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range []string{
		`migration-net@migration0`, // not completed by kvnet
		`[{"name":"migration-net","interface":"migration0","ips":["10.9.0.1/24"]}]`,                   // outside the pool
		`[{"name":"migration-net","interface":"migration0","ips":["10.210.0.1/24","10.210.0.2/24"]}]`, // two
		`[{"name":"other","interface":"migration0","ips":["10.210.0.1/24"]}]`,                         // another NAD
	} {
		if _, err := migrationAddress(pod(bad), "kubevirt", "migration-net", "migration0", pool); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// A refusal counts only when the expected webhook refused with a cause at
// the expected field.
func TestRefusedAs(t *testing.T) {
	st := &metav1.Status{
		Message: `admission webhook "virtualmachines.validate.kvnet.io" denied the request: ...`,
		Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Field: "spec.template.spec.networks[1].multus.networkName"}}},
	}
	if err := refusedAs(st, "kvnet", "spec.template.spec.networks[1].multus.networkName"); err != nil {
		t.Error(err)
	}
	if err := refusedAs(st, "virtualmachine-validator.kubevirt.io", "spec.template.spec.networks[1].multus.networkName"); err == nil {
		t.Error("a refusal by kvnet passed for virt-api's")
	}
	if err := refusedAs(st, "kvnet", "spec.template.spec.networks[0]"); err == nil {
		t.Error("a refusal at another field passed")
	}
}

func TestTakeKubeVirtCR(t *testing.T) {
	obj := func(kind string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetKind(kind)
		return u
	}
	rest, cr := takeKubeVirtCR([]*unstructured.Unstructured{obj("Namespace"), obj("KubeVirt"), obj("NetworkAttachmentDefinition")})
	if cr == nil || len(rest) != 2 || rest[0].GetKind() != "Namespace" || rest[1].GetKind() != "NetworkAttachmentDefinition" {
		t.Errorf("rest %v, cr %v", rest, cr)
	}
}

// Each cluster's policy of the cross-cluster demo is valid, and the two
// clusters' loopback ranges do not overlap (the processes of both bind them
// on one machine).
func TestSideConfigs(t *testing.T) {
	var nets []netip.Prefix
	for n := 1; n <= 2; n++ {
		c, err := config.Parse([]byte(sideConfig(n)), "kvnet-system")
		if err != nil {
			t.Fatalf("cluster %d: %v", n, err)
		}
		m := c.Migration
		if m.InCluster == nil || m.CrossCluster == nil || !m.CrossCluster.AlsoInCluster {
			t.Fatalf("cluster %d: want an in-cluster pool and a cross-cluster list with alsoInCluster", n)
		}
		cc, err := netip.ParsePrefix(m.CrossCluster.Addresses[0])
		if err != nil {
			t.Fatal(err)
		}
		nets = append(nets, netip.MustParsePrefix(m.InCluster.Pool.CIDR), cc.Masked())
	}
	for i := range nets {
		for j := i + 1; j < len(nets); j++ {
			if nets[i].Overlaps(nets[j]) {
				t.Errorf("%s overlaps %s", nets[i], nets[j])
			}
		}
	}
}
