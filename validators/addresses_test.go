package validators

import (
	"context"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/model/requested"
)

// addrRequest is a VM in namespace "ns" with one Multus network "data" on
// NAD nad, its kvnet.io/networks annotation nets and its template's
// kvnet.io/addresses tbl (either may be empty).
func addrRequest(nad, nets, tbl string) *chain.Request {
	mk := func(name, c string) nadv1.NetworkAttachmentDefinition {
		return nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: c}}
	}
	facts := lookup.NewSnapshot([]nadv1.NetworkAttachmentDefinition{
		mk("l2-subnets", `{"name":"l2","type":"ovn-k8s-cni-overlay","topology":"layer2","subnets":"10.100.0.0/24"}`),
		mk("l2-persistent", `{"name":"l2p","type":"ovn-k8s-cni-overlay","topology":"layer2","subnets":"10.100.0.0/24,fd00:100::/64","allowPersistentIPs":true}`),
		mk("l3", `{"name":"l3","type":"ovn-k8s-cni-overlay","topology":"layer3","subnets":"10.128.0.0/14/23"}`),
		mk("l2-bare", `{"name":"l2b","type":"ovn-k8s-cni-overlay","topology":"layer2"}`),
		mk("localnet-bare", `{"name":"ln","type":"ovn-k8s-cni-overlay","topology":"localnet"}`),
		mk("localnet-subnets", `{"name":"lns","type":"ovn-k8s-cni-overlay","topology":"localnet","subnets":"192.168.10.0/24"}`),
		mk("bridge", `{"name":"br","type":"bridge","ipam":{"type":"static","subnet":"10.10.0.0/24"}}`),
		mk("bridge-persistent", `{"name":"brp","type":"bridge","allowPersistentIPs":true}`),
	}, nil, nil)
	meta := &metav1.ObjectMeta{Namespace: "ns", Name: "vm", Annotations: map[string]string{}}
	tmeta := &metav1.ObjectMeta{Annotations: map[string]string{}}
	if nets != "" {
		meta.Annotations[requested.Annotation] = nets
	}
	if tbl != "" {
		tmeta.Annotations[addresses.Annotation] = tbl
	}
	spec := &kubevirtv1.VirtualMachineInstanceSpec{Networks: []kubevirtv1.Network{{Name: "data", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: nad}}}}}
	d := config.Config{}.Default("")
	return &chain.Request{
		Kind: chain.KindVM, Namespace: "ns", Name: "vm", Meta: meta, TemplateMeta: tmeta,
		TemplateMetaPath: field.NewPath("spec", "template", "metadata"),
		Spec:             spec, SpecPath: field.NewPath("spec", "template", "spec"), Config: &d, Facts: facts,
	}
}

// Fixed ips on an OVN-Kubernetes secondary network with IPAM are refused,
// one cause naming the field that asked, what OVN-K would do and what to
// use instead; where OVN-K takes static addresses (no subnets) or the CNI
// is another, they pass as before.
func TestAddressesOVNKubernetesStaticIPs(t *testing.T) {
	ask := func(nad, ips string) string {
		return `[{"name":"data","nad":"` + nad + `","ips":[` + ips + `]}]`
	}
	netsPath := "metadata.annotations[kvnet.io/networks]"
	tblPath := "spec.template.metadata.annotations[kvnet.io/addresses][data]"
	tests := map[string]struct {
		nad, nets, tbl string
		errPath        string // "" = admitted
		instead        string // what the cause proposes
		warning        string
	}{
		"layer2 with subnets":           {nad: "l2-subnets", nets: ask("l2-subnets", `"10.100.0.5/24"`), errPath: netsPath, instead: `set "allowPersistentIPs": true`},
		"layer2 persistent, dual-stack": {nad: "l2-persistent", nets: ask("l2-persistent", `"10.100.0.5/24","fd00:100::5/64"`), errPath: netsPath, instead: "the NAD allows persistent IPs"},
		"layer3":                        {nad: "l3", nets: ask("l3", `"10.128.4.5/23"`), errPath: netsPath, instead: "allowPersistentIPs"},
		"localnet with subnets":         {nad: "localnet-subnets", nets: ask("localnet-subnets", `"192.168.10.5/24"`), errPath: netsPath, instead: "a NAD without subnets"},
		// After the mutator, the template holds the same request: still one cause, on what the user wrote.
		"annotation and its template copy": {nad: "l2-subnets", nets: ask("l2-subnets", `"10.100.0.5/24"`), tbl: `{"data":{"ips":["10.100.0.5/24"]}}`, errPath: netsPath},
		"template by hand":                 {nad: "l2-subnets", tbl: `{"data":{"ips":["10.100.0.5/24"]}}`, errPath: tblPath},
		"layer2 without subnets":           {nad: "l2-bare", nets: ask("l2-bare", `"10.200.0.5/24"`)},
		"localnet without subnets":         {nad: "localnet-bare", nets: ask("localnet-bare", `"10.200.0.5/24"`)},
		"MAC only on layer2 with subnets":  {nad: "l2-subnets", nets: `[{"name":"data","nad":"l2-subnets","mac":"02:00:00:00:00:05"}]`},
		"bridge with a subnet":             {nad: "bridge", nets: ask("bridge", `"10.10.0.5/24"`)},
		"bridge allowing persistent IPs":   {nad: "bridge-persistent", nets: ask("bridge-persistent", `"10.10.0.5/24"`), warning: "the fixed ips take the place of its IPAMClaim"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := addrRequest(tc.nad, tc.nets, tc.tbl)
			errs, err := AddressesCheck{}.Validate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.errPath == "" {
				if len(errs) > 0 {
					t.Fatalf("refused: %v", errs)
				}
			} else {
				if len(errs) != 1 || errs[0].Field != tc.errPath || errs[0].Type != field.ErrorTypeInvalid {
					t.Fatalf("errors = %v, want one Invalid at %s", errs, tc.errPath)
				}
				for _, want := range []string{"ns/" + tc.nad, "cannot allocate a static IP request with IPAM", tc.instead} {
					if !strings.Contains(errs[0].Detail, want) {
						t.Errorf("cause %q lacks %q", errs[0].Detail, want)
					}
				}
			}
			w := strings.Join(req.Warnings, "\n")
			if tc.warning == "" && w != "" || !strings.Contains(w, tc.warning) {
				t.Errorf("warnings %q, want %q", w, tc.warning)
			}
		})
	}
}
