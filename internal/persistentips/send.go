package persistentips

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// SourceNetworks is the network identity a source VMI carries to another
// cluster: for each secondary Multus network whose claim (kvnet's, by name
// and owner) holds IPs, the claim's IPs and network and the interface's
// MAC. The MAC is the one the VMI reports (status.interfaces, what the
// guest has), else the one its spec asks for; a network without either is
// sent without a MAC and the target's CNI chooses one. A claim whose IPs
// do not parse is an error naming it, not a network left out: the target
// would then wait for it forever.
func SourceNetworks(ctx context.Context, r client.Reader, vmi *kubevirtv1.VirtualMachineInstance) ([]ReceivedNetwork, error) {
	owner := OwnerOf(vmi)
	var out []ReceivedNetwork
	for _, vn := range vmi.Spec.Networks {
		if vn.Multus == nil || vn.Multus.Default {
			continue
		}
		var c ipamv1alpha1.IPAMClaim
		key := client.ObjectKey{Namespace: vmi.Namespace, Name: ClaimName(owner.Name, vn.Name)}
		switch err := r.Get(ctx, key, &c); {
		case apierrors.IsNotFound(err):
			continue // no persistent IPs on this network
		case err != nil:
			return nil, fmt.Errorf("reading IPAMClaim %s: %w", key, err)
		}
		if !owner.Owns(&c) || len(c.Status.IPs) == 0 {
			continue
		}
		n := ReceivedNetwork{Name: vn.Name, NetworkName: c.Spec.Network, MAC: interfaceMAC(vmi, vn.Name)}
		for i, ip := range c.Status.IPs {
			p, err := netip.ParsePrefix(ip)
			if err != nil {
				return nil, fmt.Errorf("IPAMClaim %s status.ips[%d]: %w", key, i, err)
			}
			n.IPs = append(n.IPs, p)
		}
		out = append(out, n)
	}
	return out, nil
}

// interfaceMAC is the MAC of the VMI interface of network name: reported
// in status, else asked for in spec; nil when neither parses.
func interfaceMAC(vmi *kubevirtv1.VirtualMachineInstance, name string) net.HardwareAddr {
	for _, s := range vmi.Status.Interfaces {
		if s.Name == name {
			if mac, err := net.ParseMAC(s.MAC); err == nil && len(mac) == 6 {
				return mac
			}
		}
	}
	for _, i := range vmi.Spec.Domain.Devices.Interfaces {
		if i.Name == name {
			if mac, err := net.ParseMAC(i.MacAddress); err == nil && len(mac) == 6 {
				return mac
			}
		}
	}
	return nil
}
