package primaryudn

import (
	"fmt"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

const (
	udnNS = "tenant-u"
	// udnPrimary is a primary layer2 UDN as OVN-Kubernetes renders it.
	udnPrimary = `{"cniVersion":"1.0.0","name":"tenant-u_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.200.0.0/16,fd00:200::/64","allowPersistentIPs":true}`
	udnMAC     = "02:00:00:00:00:2a"
)

func TestPrimaryIPs(t *testing.T) {
	info := netattach.Parse(&nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: udnNS, Name: "udn"}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: udnPrimary},
	})
	noSubnets := netattach.Parse(&nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: udnNS, Name: "udn"}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: `{"name":"x","type":"ovn-k8s-cni-overlay","role":"primary","topology":"layer2"}`},
	})
	tests := map[string]struct {
		raw  string
		info *netattach.Info
		want string
		err  string
	}{
		"both families":         {raw: `{"pn":["10.200.1.2","fd00:200::2"]}`, want: "[10.200.1.2/16 fd00:200::2/64]"},
		"CIDR keeps its prefix": {raw: `{"pn":["10.200.1.2/24","fd00:200::2"]}`, want: "[10.200.1.2/24 fd00:200::2/64]"},
		// OVN-Kubernetes wants one IP per subnet, of its family, on a dual-stack network.
		"one family on a dual-stack network": {raw: `{"pn":["10.200.1.2"]}`, err: "asks for 1 IPv4 and 0 IPv6 address(es); primary network tenant-u/udn"},
		"two IPv4 on a dual-stack network":   {raw: `{"pn":["10.200.1.2","10.200.1.3"]}`, err: "takes exactly 1 IPv4 and 1 IPv6"},
		"three on a dual-stack network":      {raw: `{"pn":["10.200.1.2","fd00:200::2","fd00:200::3"]}`, err: "asks for 1 IPv4 and 2 IPv6"},
		"other interfaces only":              {raw: `{"eth1":["10.200.1.2"]}`, want: "[]"},
		"outside every subnet":               {raw: `{"pn":["10.9.0.1"]}`, err: "in no subnet"},
		"family without a subnet":            {raw: `{"pn":["2001:db8::1"]}`, info: noSubnets, err: "no prefix length"},
		"CIDR without subnets":               {raw: `{"pn":["2001:db8::1/64"]}`, info: noSubnets, want: "[2001:db8::1/64]"},
		"not an IP":                          {raw: `{"pn":["web"]}`, err: "neither an IP nor a CIDR"},
		"not the right shape":                {raw: `["10.200.1.2"]`, err: `want {"<interface>"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			i := tc.info
			if i == nil {
				i = info
			}
			got, err := PrimaryIPs(tc.raw, "pn", i)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s := fmt.Sprint(got); s != tc.want && !(tc.want == "[]" && len(got) == 0) {
				t.Errorf("got %s, want %s", s, tc.want)
			}
		})
	}
}

// FuzzCompleteDefaultElement: any default-network annotation and
// network.kubevirt.io/addresses value is completed or refused without a
// panic; a completed annotation parses, carries kvnet's keys, and
// completing it again changes nothing (reinvocation is a no-op).
func FuzzCompleteDefaultElement(f *testing.F) {
	for _, s := range [][2]string{
		{"", `{"pn":["10.200.0.9"]}`},
		{"ovn-kubernetes/default", `{"pn":["fd00:200::1/64"]}`},
		{`[{"name":"default","namespace":"ovn-kubernetes","mac":"02:00:00:00:00:2a","x.io/k":[1,{"a":null}]}]`, `{}`},
		{`[{"name":"default","namespace":"ovn-kubernetes","ips":["10.200.0.9/16"],"ipam-claim-reference":"web.pn"}]`, `{"pn":["10.200.0.9"]}`},
		{`[{"name":"default"},{"name":"x"}]`, `nope`},
		{`{"name":"default","namespace":"ovn-kubernetes"}`, `{"pn":["10.9.9.9"]}`},
	} {
		f.Add(s[0], s[1])
	}
	info := netattach.Parse(&nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: udnNS, Name: "udn"}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: udnPrimary},
	})
	f.Fuzz(func(t *testing.T, cur, addresses string) {
		ips, _ := PrimaryIPs(addresses, "pn", info)
		want := DefaultElement{Namespace: "ovn-kubernetes", NAD: "default", IPs: ips, MAC: udnMAC, Claim: "web.pn"}
		present := cur != ""
		out, changed, conflict := CompleteDefaultElement(cur, present, udnNS, want)
		if conflict != "" {
			return
		}
		if !present && !changed {
			t.Fatalf("nothing written for an absent annotation")
		}
		elems, err := multus.ParseDefaultNetwork(out)
		if err != nil || len(elems) != 1 || elems[0].String(multus.KeyIPAMClaimReference) != "web.pn" || elems[0].String(multus.KeyMAC) != udnMAC {
			t.Fatalf("completed %q to %q (%v): not one element with kvnet's keys", cur, out, err)
		}
		again, changed2, conflict2 := CompleteDefaultElement(out, true, udnNS, want)
		if conflict2 != "" || changed2 || again != out {
			t.Fatalf("second pass on %q: %q changed=%v conflict=%q", out, again, changed2, conflict2)
		}
	})
}
