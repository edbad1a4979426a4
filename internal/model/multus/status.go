package multus

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
)

// NetworkStatusAnnotation is where Multus records, per attachment, what
// the CNI gave the pod (network-status, multi-net spec v1.3 section 4.1.2).
const NetworkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"

// NetworkStatus is one attachment of a pod's network-status: the NAD it
// came from ("namespace/name"; the cluster default network's name for the
// primary interface) and the addresses the CNI assigned on it.
type NetworkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface,omitempty"`
	IPs       []string `json:"ips,omitempty"`
	MAC       string   `json:"mac,omitempty"`
	Default   bool     `json:"default,omitempty"`
}

// ParseNetworkStatus reads a network-status annotation value.
func ParseNetworkStatus(annotation string) ([]NetworkStatus, error) {
	var out []NetworkStatus
	if err := json.Unmarshal([]byte(annotation), &out); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", NetworkStatusAnnotation, err)
	}
	return out, nil
}

// Addrs are the attachment's addresses; Multus records them without a
// prefix length, some CNIs with one, and an entry that is neither is left
// out.
func (s NetworkStatus) Addrs() []netip.Addr {
	var out []netip.Addr
	for _, ip := range s.IPs {
		if p, err := netip.ParsePrefix(ip); err == nil {
			out = append(out, p.Addr())
		} else if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// NAD is the attachment's NAD as namespace and name; a name without a
// namespace is in podNamespace.
func (s NetworkStatus) NAD(podNamespace string) (namespace, name string) {
	if ns, n, ok := strings.Cut(s.Name, "/"); ok {
		return ns, n
	}
	return podNamespace, s.Name
}
