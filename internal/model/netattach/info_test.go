package netattach

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func nad(resource, cfg string) *nadv1.NetworkAttachmentDefinition {
	n := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "n", ResourceVersion: "7"},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: cfg},
	}
	if resource != "" {
		n.Annotations = map[string]string{ResourceNameAnnotation: resource}
	}
	return n
}

func TestParse(t *testing.T) {
	cases := map[string]struct {
		nad  *nadv1.NetworkAttachmentDefinition
		want Info
		bad  bool
	}{
		"bridge": {nad: nad("", `{"cniVersion":"0.4.0","name":"br-net","type":"bridge","ipam":{"type":"whereabouts"}}`),
			want: Info{CNIType: "bridge", NetworkName: "br-net", IPAMType: "whereabouts"}},
		"kube-ovn with provider": {nad: nad("", `{"type":"kube-ovn","provider":"p.ns.ovn"}`),
			want: Info{CNIType: "kube-ovn", Provider: "p.ns.ovn"}},
		"OVN-K persistent IPs": {nad: nad("", `{"name":"l2","type":"ovn-k8s-cni-overlay","topology":"layer2","allowPersistentIPs":true,"role":"primary"}`),
			want: Info{CNIType: "ovn-k8s-cni-overlay", NetworkName: "l2", AllowPersistentIPs: true, Role: "primary", Topology: "layer2"}},
		"conflist takes role and topology from the first plugin": {nad: nad("", `{"name":"p","plugins":[{"type":"ovn-k8s-cni-overlay","topology":"layer3","role":"primary"}]}`),
			want: Info{CNIType: "ovn-k8s-cni-overlay", NetworkName: "p", Role: "primary", Topology: "layer3"}},
		"conflist takes the first plugin": {nad: nad("intel.com/x", `{"name":"list","plugins":[{"type":"sriov","ipam":{"type":"host-local"},"provider":"pp","allowPersistentIPs":true},{"type":"tuning"}]}`),
			want: Info{ResourceName: "intel.com/x", CNIType: "sriov", NetworkName: "list", IPAMType: "host-local", Provider: "pp", AllowPersistentIPs: true}},
		"OVN-K subnets, layer3 host-subnet length dropped": {nad: nad("", `{"name":"l3","type":"ovn-k8s-cni-overlay","subnets":"10.128.0.0/14/23, fd00:10::/64"}`),
			want: Info{CNIType: "ovn-k8s-cni-overlay", NetworkName: "l3", Subnets: []netip.Prefix{netip.MustParsePrefix("10.128.0.0/14"), netip.MustParsePrefix("fd00:10::/64")}}},
		"IPAM subnet, range and ranges": {nad: nad("", `{"type":"bridge","ipam":{"type":"host-local","subnet":"10.1.0.0/24","range":"10.2.0.0/24","ranges":[[{"subnet":"fd00:1::/64"}]]}}`),
			want: Info{CNIType: "bridge", IPAMType: "host-local", Subnets: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24"), netip.MustParsePrefix("10.2.0.0/24"), netip.MustParsePrefix("fd00:1::/64")}}},
		"unparsable subnets are skipped": {nad: nad("", `{"type":"bridge","subnets":"nope","ipam":{"subnet":"10.0.0.1/24"}}`),
			want: Info{CNIType: "bridge", Subnets: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}}},
		"no config":            {nad: nad("jaguarmicro.com/jaguar", "  "), want: Info{ResourceName: "jaguarmicro.com/jaguar"}},
		"broken config":        {nad: nad("", `{"type":`), bad: true},
		"config not an object": {nad: nad("", `["bridge"]`), bad: true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			got := Parse(c.nad)
			if (got.ConfigError != nil) != c.bad {
				t.Fatalf("ConfigError = %v, want error: %v", got.ConfigError, c.bad)
			}
			if got.Namespace != "ns" || got.Name != "n" || got.ResourceVersion != "7" || got.Ref() != "ns/n" {
				t.Errorf("identity = %+v", got)
			}
			if c.bad {
				return
			}
			got.Namespace, got.Name, got.ResourceVersion = "", "", ""
			if !reflect.DeepEqual(*got, c.want) {
				t.Errorf("got %+v\nwant %+v", *got, c.want)
			}
		})
	}
}

func TestIsPrimaryUDN(t *testing.T) {
	for cfg, want := range map[string]bool{
		`{"name":"a","type":"ovn-k8s-cni-overlay","role":"primary","topology":"layer2"}`:   true,
		`{"name":"a","type":"ovn-k8s-cni-overlay","role":"primary","topology":"layer3"}`:   true, // primary, whatever the topology
		`{"name":"a","type":"ovn-k8s-cni-overlay","role":"secondary","topology":"layer2"}`: false,
		`{"name":"a","type":"ovn-k8s-cni-overlay","topology":"layer2"}`:                    false,
		`{"name":"a","type":"bridge","role":"primary"}`:                                    false, // only OVN-K has primary networks
		`{"type":`: false,
	} {
		if got := Parse(nad("", cfg)).IsPrimaryUDN(); got != want {
			t.Errorf("%s: IsPrimaryUDN = %v, want %v", cfg, got, want)
		}
	}
}

func TestClassify(t *testing.T) {
	sriov := []string{"intel.com/", "nvidia.com/"}
	vdpa := []string{"jaguarmicro.com/", "nvidia.com/vdpa", ""}
	for res, want := range map[string]Kind{
		"":                        KindBridge,
		"intel.com/sriov_netdev":  KindSRIOV,
		"nvidia.com/mlnx_sriov":   KindSRIOV,
		"nvidia.com/vdpa_vf":      KindVDPA, // vDPA prefixes win over the vendor's SR-IOV prefix
		"jaguarmicro.com/jaguar":  KindVDPA,
		"example.com/gpu":         KindBridge,
		"intel.comx/not-a-prefix": KindBridge,
	} {
		if got := (&Info{ResourceName: res}).Classify(sriov, vdpa); got != want {
			t.Errorf("Classify(%q) = %s, want %s", res, got, want)
		}
	}
}

func TestKubeOVNProvider(t *testing.T) {
	i := &Info{Namespace: "tenant-a", Name: "attach", CNIType: "kube-ovn"}
	if !i.IsKubeOVN() || i.KubeOVNProvider() != "attach.tenant-a.ovn" {
		t.Errorf("default provider = %s", i.KubeOVNProvider())
	}
	i.Provider = "custom"
	if i.KubeOVNProvider() != "custom" {
		t.Errorf("configured provider = %s", i.KubeOVNProvider())
	}
}

// The nodeSelector annotation reads as network-resources-injector reads it
// (one "key=value", or "key" for an empty value, spaces trimmed); what a
// pod's nodeSelector could not hold is an error naming the annotation.
func TestNodeSelector(t *testing.T) {
	for in, c := range map[string]struct {
		want *NodeLabel
		err  string
	}{
		"rack=r1":               {want: &NodeLabel{Key: "rack", Value: "r1"}},
		" example.com/rack = a": {want: &NodeLabel{Key: "example.com/rack", Value: "a"}},
		"feature.node/sriov":    {want: &NodeLabel{Key: "feature.node/sriov"}},
		"a=b=c":                 {err: "more than one label"},
		"bad key!=v":            {err: `key "bad key!"`},
		"k=bad value":           {err: `value "bad value"`},
	} {
		i := Parse(&nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{NodeSelectorAnnotation: in}}})
		switch {
		case c.err != "":
			if i.NodeSelectorError == nil || !strings.Contains(i.NodeSelectorError.Error(), c.err) || !strings.Contains(i.NodeSelectorError.Error(), NodeSelectorAnnotation) || i.NodeSelector != nil {
				t.Errorf("%q: %v, %v; want an error with %q", in, i.NodeSelector, i.NodeSelectorError, c.err)
			}
		case i.NodeSelectorError != nil || i.NodeSelector == nil || *i.NodeSelector != *c.want:
			t.Errorf("%q: %+v, %v; want %+v", in, i.NodeSelector, i.NodeSelectorError, c.want)
		}
	}
	if i := Parse(&nadv1.NetworkAttachmentDefinition{}); i.NodeSelector != nil || i.NodeSelectorError != nil {
		t.Errorf("no annotation: %+v %v", i.NodeSelector, i.NodeSelectorError)
	}
}
