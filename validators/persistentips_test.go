package validators

import (
	"context"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/requested"
)

func piRequest(kind chain.Kind, annotations map[string]string, cfg config.Config, nets ...[2]string) *chain.Request {
	mk := func(name, c string) nadv1.NetworkAttachmentDefinition {
		return nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: c}}
	}
	facts := lookup.NewSnapshot([]nadv1.NetworkAttachmentDefinition{
		mk("ovn", `{"name":"ovn-net","type":"ovn-k8s-cni-overlay","allowPersistentIPs":true}`),
		mk("plain", `{"name":"plain","type":"bridge"}`),
		mk("bridgy", `{"name":"bridgy","type":"bridge","allowPersistentIPs":true}`),
	}, nil, nil)
	spec := &kubevirtv1.VirtualMachineInstanceSpec{}
	for _, n := range nets {
		spec.Networks = append(spec.Networks, kubevirtv1.Network{Name: n[0], NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: n[1]}}})
	}
	meta := &metav1.ObjectMeta{Namespace: "ns", Name: "vm", Annotations: annotations}
	d := cfg.Default("")
	sp := field.NewPath("spec", "template", "spec")
	if kind == chain.KindVMI {
		sp = field.NewPath("spec")
	}
	return &chain.Request{Kind: kind, Namespace: "ns", Name: "vm", Meta: meta, TemplateMeta: meta, Spec: spec, SpecPath: sp, Config: &d, Facts: facts}
}

func TestPersistentIPsValidator(t *testing.T) {
	annotation := func(nad string) map[string]string {
		return map[string]string{requested.Annotation: `[{"name":"data","nad":"` + nad + `","persistentIPs":true}]`}
	}
	rule := config.Config{NetworkRules: []config.NetworkRule{{Name: "r", Networks: []config.Network{{Name: "data", NAD: netattach.RefOf("plain"), PersistentIPs: true}}}}}
	off := config.Config{PersistentIPs: config.PersistentIPs{Enabled: ptr.To(false)}}
	owned := map[string]string{requested.Annotation: `[{"name":"data","nad":"plain","persistentIPs":true}]`}
	tests := map[string]struct {
		kind     chain.Kind
		ann      map[string]string
		cfg      config.Config
		nets     [][2]string
		errPaths []string
		warning  string
	}{
		"annotation asks, NAD allows":     {ann: annotation("ovn"), nets: [][2]string{{"data", "ovn"}}},
		"annotation asks, NAD does not":   {ann: annotation("plain"), nets: [][2]string{{"data", "plain"}}, errPaths: []string{"metadata.annotations[kvnet.io/networks]"}},
		"user's own network wins":         {ann: annotation("plain"), nets: [][2]string{{"data", "ovn"}}},
		"rule asks, NAD does not":         {cfg: rule, nets: [][2]string{{"data", "plain"}}, errPaths: []string{"spec.template.spec.networks[0].multus.networkName"}},
		"rule asks, network not in spec":  {cfg: rule},
		"CNI that ignores claims: warned": {nets: [][2]string{{"data", "bridgy"}}, warning: "not known to honour IPAMClaims"},
		"feature off: warned":             {cfg: off, nets: [][2]string{{"data", "ovn"}}, warning: "turned off"},
		// ipam-extensions names these claims vm.data and vm.my.data; kvnet adds a hash.
		"network name with capitals: claim-name warning": {nets: [][2]string{{"Data", "ovn"}}, warning: `IPAMClaim "vm.data-`},
		"network name with _: claim-name warning":        {nets: [][2]string{{"my_data", "ovn"}}, warning: "ipam-extensions would name that claim differently"},
		"no claim, no claim-name warning":                {nets: [][2]string{{"Data", "plain"}}},
		"standalone VMI: checked":                        {kind: chain.KindVMI, ann: owned, nets: [][2]string{{"data", "plain"}}, errPaths: []string{"metadata.annotations[kvnet.io/networks]"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			kind := tc.kind
			if kind == "" {
				kind = chain.KindVM
			}
			req := piRequest(kind, tc.ann, tc.cfg, tc.nets...)
			errs, err := PersistentIPs{}.Validate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			var paths []string
			for _, e := range errs {
				paths = append(paths, e.Field)
				if !strings.Contains(e.Detail, "allowPersistentIPs") {
					t.Errorf("error %q does not name allowPersistentIPs", e.Detail)
				}
			}
			if strings.Join(paths, ",") != strings.Join(tc.errPaths, ",") {
				t.Fatalf("error paths = %v, want %v", paths, tc.errPaths)
			}
			w := strings.Join(req.Warnings, "\n")
			if tc.warning == "" && w != "" || !strings.Contains(w, tc.warning) {
				t.Fatalf("warnings %q, want %q", w, tc.warning)
			}
		})
	}
}
