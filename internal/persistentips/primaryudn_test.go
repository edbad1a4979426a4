package persistentips

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/owner"
)

// Primary UDN NAD configs as OVN-Kubernetes renders them for a
// UserDefinedNetwork (name "<ns>_<udn>").
const (
	udnLayer2     = `{"cniVersion":"1.0.0","name":"%s_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.200.0.0/16","allowPersistentIPs":true}`
	udnLayer3     = `{"cniVersion":"1.0.0","name":"%s_udn","type":"ovn-k8s-cni-overlay","topology":"layer3","role":"primary","subnets":"10.200.0.0/16/24","allowPersistentIPs":true}`
	udnNoPersist  = `{"cniVersion":"1.0.0","name":"%s_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.200.0.0/16"}`
	udnNoName     = `{"cniVersion":"1.0.0","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","allowPersistentIPs":true}`
	udnSecondary2 = `{"cniVersion":"1.0.0","name":"sec","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"secondary","allowPersistentIPs":true}`
)

func udnFacts(nads map[string]string) *lookup.Snapshot {
	var list []nadv1.NetworkAttachmentDefinition
	for ref, cfg := range nads {
		ns, name, _ := strings.Cut(ref, "/")
		list = append(list, nadv1.NetworkAttachmentDefinition{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: strings.ReplaceAll(cfg, "%s", ns)},
		})
	}
	return lookup.NewSnapshot(list, nil, nil)
}

func primaryOn() *config.Config {
	c := config.Config{PersistentIPs: config.PersistentIPs{PrimaryUDN: config.PrimaryUDN{Enabled: true}}}.Default("kvnet")
	return &c
}

func TestDesiredPrimary(t *testing.T) {
	off := config.Config{}.Default("kvnet")
	ipsOff := primaryOn()
	ipsOff.PersistentIPs.Enabled = ptr.To(false)
	excluded := primaryOn()
	excluded.ExcludedNamespaces = append(excluded.ExcludedNamespaces, "u")
	podNet := `{"domain":{"devices":{"interfaces":[{"name":"pn","masquerade":{}}]}},"networks":[{"name":"pn","pod":{}}]}`
	cases := map[string]struct {
		cfg    *config.Config
		nads   map[string]string
		spec   string
		claim  string // "<name> <spec.network> <spec.interface>"; "" for none
		reason string // part of the skip reason; "" for no skip
	}{
		"layer2 primary with persistent IPs": {nads: map[string]string{"u/udn": udnLayer2}, spec: podNet, claim: "vm.pn u_udn ovn-udn1"},
		"implicit pod network of a VM that declares none": {nads: map[string]string{"u/udn": udnLayer2}, spec: `{"domain":{"devices":{}}}`,
			claim: "vm.default u_udn ovn-udn1"},
		"autoattachPodInterface false: no pod network": {nads: map[string]string{"u/udn": udnLayer2}, spec: `{"domain":{"devices":{"autoattachPodInterface":false}}}`},
		"multus default network instead of the pod network": {nads: map[string]string{"u/udn": udnLayer2, "u/sec": udnSecondary2},
			spec: `{"domain":{"devices":{}},"networks":[{"name":"d","multus":{"networkName":"sec","default":true}}]}`},
		"off by default":                      {cfg: &off, nads: map[string]string{"u/udn": udnLayer2}, spec: podNet},
		"persistent IPs off turns it off too": {cfg: ipsOff, nads: map[string]string{"u/udn": udnLayer2}, spec: podNet},
		"excluded namespace":                  {cfg: excluded, nads: map[string]string{"u/udn": udnLayer2}, spec: podNet},
		"no primary network in the namespace": {nads: map[string]string{"u/sec": udnSecondary2, "other/udn": udnLayer2}, spec: podNet},
		"layer3 primary":                      {nads: map[string]string{"u/udn": udnLayer3}, spec: podNet, reason: `topology "layer3"`},
		"primary without allowPersistentIPs":  {nads: map[string]string{"u/udn": udnNoPersist}, spec: podNet, reason: "allowPersistentIPs"},
		"primary without a network name":      {nads: map[string]string{"u/udn": udnNoName}, spec: podNet, reason: `no "name"`},
		"two primary networks":                {nads: map[string]string{"u/udn": udnLayer2, "u/udn2": udnLayer2}, spec: podNet, reason: "2 primary user-defined networks (u/udn, u/udn2)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := tc.cfg
			if cfg == nil {
				cfg = primaryOn()
			}
			var spec kubevirtv1.VirtualMachineInstanceSpec
			if err := json.Unmarshal([]byte(tc.spec), &spec); err != nil {
				t.Fatal(err)
			}
			o := Owner{Kind: owner.KindVM, Namespace: "u", Name: "vm", UID: "uid-1"}
			w, s, err := DesiredPrimary(context.Background(), cfg, o, &spec, udnFacts(tc.nads))
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if w != nil {
				c := w.Claim
				got = c.Name + " " + c.Spec.Network + " " + c.Spec.Interface
				if !o.Owns(c) || c.Finalizers[0] != Finalizer || c.Labels[VMLabel] != "vm" || w.Network != strings.Fields(got)[0][len("vm."):] {
					t.Errorf("claim %+v: owner, finalizer, label or network wrong", c)
				}
			}
			if got != tc.claim {
				t.Errorf("claim %q, want %q", got, tc.claim)
			}
			switch {
			case tc.reason == "" && s != nil:
				t.Errorf("skipped %+v, want no reason", s)
			case tc.reason != "" && (s == nil || !strings.Contains(s.Reason, tc.reason)):
				t.Errorf("skipped %+v, want a reason with %q", s, tc.reason)
			}
		})
	}
}

// The offline CLI prints the pod network's claim next to the secondary ones.
func TestOfflinePrimary(t *testing.T) {
	vm := `{"kind":"VirtualMachine","metadata":{"name":"web","uid":"u-1"},"spec":{"template":{"spec":{"domain":{"devices":{}},
"networks":[{"name":"default","pod":{}},{"name":"blue","multus":{"networkName":"blue"}}]}}}}`
	facts := udnFacts(map[string]string{"u/udn": udnLayer2, "u/blue": `{"name":"blue-net","type":"ovn-k8s-cni-overlay","topology":"layer2","allowPersistentIPs":true}`})
	out, err := Offline(context.Background(), primaryOn(), facts, "VirtualMachine", "u", []byte(vm))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range out {
		var c struct {
			Metadata struct{ Name string }
			Spec     struct{ Network, Interface string }
		}
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.Metadata.Name+"="+c.Spec.Network+"@"+c.Spec.Interface)
	}
	want := "web.default=u_udn@ovn-udn1 web.blue=blue-net@" + PodInterfaceName("blue")
	if strings.Join(names, " ") != want {
		t.Errorf("claims %q, want %q", strings.Join(names, " "), want)
	}
}
