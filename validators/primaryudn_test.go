package validators

import (
	"context"
	"fmt"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
)

const udnL2 = `{"name":"ns_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.200.0.0/16","allowPersistentIPs":true}`

func udnRequest(primaries []string, templateAnnotations map[string]string, cfg config.Config) *chain.Request {
	var nads []nadv1.NetworkAttachmentDefinition
	for i, c := range primaries {
		nads = append(nads, nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("udn%d", i)}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: c}})
	}
	spec := &kubevirtv1.VirtualMachineInstanceSpec{
		Networks: []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}},
	}
	spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "default", MacAddress: "02:00:00:00:00:07"}}
	d := cfg.Default("")
	return &chain.Request{
		Kind: chain.KindVM, Namespace: "ns", Name: "vm",
		Meta: &metav1.ObjectMeta{Namespace: "ns", Name: "vm"}, TemplateMeta: &metav1.ObjectMeta{Annotations: templateAnnotations},
		Spec: spec, SpecPath: field.NewPath("spec", "template", "spec"), TemplateMetaPath: field.NewPath("spec", "template", "metadata"),
		Config: &d, Facts: lookup.NewSnapshot(nads, nil, nil),
	}
}

const (
	udnDual = `{"name":"ns_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.200.0.0/16,fd00:200::/64","allowPersistentIPs":true}`
	vmUID   = "11111111-2222-3333-4444-555555555555"
	annAddr = "spec.template.metadata.annotations[network.kubevirt.io/addresses]"
)

// heldClaim is the pod network's claim vm.default, controlled by the VM
// with uid, holding ips.
func heldClaim(uid string, ips ...string) *ipamv1alpha1.IPAMClaim {
	return &ipamv1alpha1.IPAMClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm.default", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "vm", UID: types.UID(uid), Controller: ptr.To(true),
		}}},
		Status: ipamv1alpha1.IPAMClaimStatus{IPs: ips},
	}
}

func TestPrimaryUDNValidator(t *testing.T) {
	on := config.Config{PersistentIPs: config.PersistentIPs{PrimaryUDN: config.PrimaryUDN{Enabled: true}}}
	ipsOff := on
	legacyOff := on
	legacyOff.PersistentIPs.PrimaryUDN.LegacyClaimAnnotation = ptr.To(false)
	ipsOff.PersistentIPs.Enabled = ptr.To(false)
	const annDN = "spec.template.metadata.annotations[v1.multus-cni.io/default-network]"
	tests := map[string]struct {
		cfg       *config.Config
		primaries []string
		ann       map[string]string
		errPaths  []string
		errText   string
		warning   string
		podNet    string // the pod network's name, when not "default"
		uid       string // the VM's UID (UPDATE); "" on CREATE
		claim     *ipamv1alpha1.IPAMClaim
		// defaultNAD: ovn-kubernetes/default exists
		defaultNAD bool
	}{
		"quiet":                  {primaries: []string{udnL2}},
		"IPs inside the network": {primaries: []string{udnL2}, ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4"]}`}},
		"IP outside the network": {primaries: []string{udnL2}, ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.9.3.4"]}`},
			errPaths: []string{"spec.template.metadata.annotations[network.kubevirt.io/addresses]"}, errText: "in no subnet"},
		"addresses do not parse": {primaries: []string{udnL2}, ann: map[string]string{primaryudn.AddressesAnnotation: `nope`},
			errPaths: []string{"spec.template.metadata.annotations[network.kubevirt.io/addresses]"}},
		"foreign default network": {primaries: []string{udnL2}, ann: map[string]string{multus.DefaultNetworkAnnotation: "ns/mine"},
			errPaths: []string{annDN}, errText: "selects ns/mine"},
		"kvnet's own element, partly": {primaries: []string{udnL2}, ann: map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","mac":"02:00:00:00:00:07"}]`}},
		"element with another MAC": {primaries: []string{udnL2}, ann: map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","mac":"02:00:00:00:00:99"}]`},
			errPaths: []string{annDN}, errText: `"mac"`},
		"legacy annotation naming another claim": {primaries: []string{udnL2}, ann: map[string]string{primaryudn.LegacyClaimAnnotation: "other"},
			errPaths: []string{"spec.template.metadata.annotations[k8s.ovn.org/primary-udn-ipamclaim]"}},
		"legacy annotation naming the claim": {primaries: []string{udnL2}, ann: map[string]string{primaryudn.LegacyClaimAnnotation: "vm.default"}},
		"layer3 primary: warning":            {primaries: []string{strings.Replace(udnL2, "layer2", "layer3", 1)}, warning: "layer2 primary networks only"},
		"two primaries: warning":             {primaries: []string{udnL2, udnL2}, warning: "2 primary user-defined networks"},
		"no primary network":                 {ann: map[string]string{multus.DefaultNetworkAnnotation: "ns/mine"}},
		"off by default":                     {cfg: &config.Config{}, primaries: []string{udnL2}, ann: map[string]string{multus.DefaultNetworkAnnotation: "ns/mine"}},
		"persistent IPs off":                 {cfg: &ipsOff, primaries: []string{udnL2}, ann: map[string]string{multus.DefaultNetworkAnnotation: "ns/mine"}},
		// ipam-extensions would call the claim vm.default: a move between the two changes the IP.
		// OVN-Kubernetes takes one IP per family, and only IPs the VM's claim holds.
		"dual-stack, both families": {primaries: []string{udnDual}, ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4","fd00:200::4"]}`}},
		"dual-stack, one family": {primaries: []string{udnDual}, ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4"]}`},
			errPaths: []string{annAddr}, errText: "takes exactly 1 IPv4 and 1 IPv6"},
		"dual-stack, two IPv4": {primaries: []string{udnDual}, ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4","10.200.3.5"]}`},
			errPaths: []string{annAddr}, errText: "asks for 2 IPv4 and 0 IPv6"},
		"the VM's claim holds the IPs": {primaries: []string{udnL2}, uid: vmUID, claim: heldClaim(vmUID, "10.200.3.4/16"),
			ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4"]}`}},
		"the VM's claim holds other IPs": {primaries: []string{udnL2}, uid: vmUID, claim: heldClaim(vmUID, "10.200.9.9/16"),
			ann:      map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4"]}`},
			errPaths: []string{annAddr}, errText: "IPAMClaim vm.default already holds [10.200.9.9/16]"},
		"the VM's claim has no IPs yet": {primaries: []string{udnL2}, uid: vmUID, claim: heldClaim(vmUID),
			ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4"]}`}},
		"another VM's claim of that name": {primaries: []string{udnL2}, uid: vmUID, claim: heldClaim("00000000-0000-0000-0000-00000000dead", "10.200.9.9/16"),
			ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4"]}`}},
		"CREATE: no claim is the VM's yet": {primaries: []string{udnL2}, claim: heldClaim(vmUID, "10.200.9.9/16"),
			ann: map[string]string{primaryudn.AddressesAnnotation: `{"default":["10.200.3.4"]}`}},
		"legacy annotation off, no default-network NAD: warning": {cfg: &legacyOff, primaries: []string{udnL2}, warning: "nothing will carry the claim"},
		"legacy annotation off, default-network NAD there":       {cfg: &legacyOff, primaries: []string{udnL2}, defaultNAD: true},
		"pod network with capitals: claim-name warning":          {primaries: []string{udnL2}, podNet: "Default", warning: "ipam-extensions would name that claim differently"},
		"pod network with _: claim-name warning":                 {primaries: []string{udnL2}, podNet: "pod_net", warning: "ipam-extensions would name that claim differently"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := on
			if tc.cfg != nil {
				cfg = *tc.cfg
			}
			req := udnRequest(tc.primaries, tc.ann, cfg)
			req.Meta.UID = types.UID(tc.uid)
			if tc.defaultNAD {
				req.Facts.(*lookup.Snapshot).NADs["ovn-kubernetes/default"] = &netattach.Info{Namespace: "ovn-kubernetes", Name: "default", CNIType: netattach.CNITypeOVNKubernetes}
			}
			if tc.claim != nil {
				req.Facts.(*lookup.Snapshot).Claims = map[string]*ipamv1alpha1.IPAMClaim{"ns/" + tc.claim.Name: tc.claim}
			}
			if tc.podNet != "" {
				req.Spec.Networks[0].Name, req.Spec.Domain.Devices.Interfaces[0].Name = tc.podNet, tc.podNet
			}
			errs, err := PrimaryUDNCheck{}.Validate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, e := range errs {
				paths = append(paths, e.Field)
				if tc.errText != "" && !strings.Contains(e.Error(), tc.errText) {
					t.Errorf("error %q lacks %q", e.Error(), tc.errText)
				}
			}
			if fmt.Sprint(paths) != fmt.Sprint(tc.errPaths) && !(len(paths) == 0 && len(tc.errPaths) == 0) {
				t.Errorf("error paths %v, want %v (%v)", paths, tc.errPaths, errs)
			}
			w := strings.Join(req.Warnings, "\n")
			if tc.warning != "" && !strings.Contains(w, tc.warning) || tc.warning == "" && w != "" {
				t.Errorf("warnings %q, want %q", w, tc.warning)
			}
		})
	}
}
