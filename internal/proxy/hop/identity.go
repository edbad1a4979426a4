package hop

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
)

// identityMagic starts a migration's network identity, the hop's third
// request kind: the source proxy tells the target, before the target pod
// can exist, which IPs and MAC each of the VM's networks holds, so that the
// receiving VM keeps them. Versioned by its last byte, like the
// other magics; a proxy that predates it answers bad-preamble. Version 2
// carries the route (the sending and the receiving VM); version 1, which
// carried only the migration ID, is refused as bad-preamble.
var identityMagic = [6]byte{'K', 'V', 'N', 'I', 'D', 2}

// Bounds of an identity, each checked before anything is allocated:
// KubeVirt's VMs carry a handful of interfaces, each with one address per
// family (a few more on dual-stack or with extra IPs).
const (
	MaxIdentityNetworks = 32
	MaxIdentityIPs      = 8
	maxNetworkName      = 63
	maxNADNetworkName   = 253
)

// NetworkIdentity is what one network of the VM holds: its name (the VM's
// spec.networks[].name, which names its claim), the interface's MAC and
// the claim's IPs, as the CNI recorded them (prefixes, as in
// IPAMClaim.status.ips).
type NetworkIdentity struct {
	Name string
	// NetworkName is the network the NAD attaches to (its CNI config's
	// name, OVN-Kubernetes' network): the target's NAD for Name must
	// attach to the same one, or the addresses mean nothing there.
	NetworkName string
	MAC         net.HardwareAddr
	IPs         []netip.Prefix
}

// Identity is a migration's network identity as the hop carries it.
//
// Wire format, after the magic: route (see appendRoute) | network count (1) | per network: name length (1) | name | network name
// length (1) | network name | MAC length (1: 0 or 6) | MAC | IP count (1) |
// per IP: address length (1: 4 or 16) | address | prefix length (1).
type Identity struct {
	Route
	Networks []NetworkIdentity
}

// Validate says what is wrong with id, naming the field: the same checks
// bound what a peer may send and what a source may offer.
func (id Identity) Validate() error {
	if err := id.Route.Validate(); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	if len(id.Networks) == 0 || len(id.Networks) > MaxIdentityNetworks {
		return fmt.Errorf("identity: %d networks, want 1-%d", len(id.Networks), MaxIdentityNetworks)
	}
	seen := map[string]bool{}
	for i, n := range id.Networks {
		f := fmt.Sprintf("identity: networks[%d]", i)
		if err := checkNetworkName(n.Name); err != nil {
			return fmt.Errorf("%s.name: %w", f, err)
		}
		if seen[n.Name] {
			return fmt.Errorf("%s.name: %q twice", f, n.Name)
		}
		seen[n.Name] = true
		if n.NetworkName == "" || len(n.NetworkName) > maxNADNetworkName {
			return fmt.Errorf("%s.networkName: %d bytes, want 1-%d", f, len(n.NetworkName), maxNADNetworkName)
		}
		for _, c := range []byte(n.NetworkName) {
			if c < 0x21 || c > 0x7e {
				return fmt.Errorf("%s.networkName: a byte outside printable ASCII", f)
			}
		}
		if len(n.MAC) != 0 && len(n.MAC) != 6 {
			return fmt.Errorf("%s.mac: %d bytes, want none or 6", f, len(n.MAC))
		}
		if len(n.MAC) == 6 && n.MAC[0]&1 == 1 {
			return fmt.Errorf("%s.mac: %s is a multicast address", f, n.MAC)
		}
		if len(n.IPs) > MaxIdentityIPs {
			return fmt.Errorf("%s.ips: %d, want at most %d", f, len(n.IPs), MaxIdentityIPs)
		}
		ips := map[netip.Addr]bool{}
		for j, p := range n.IPs {
			a := p.Addr()
			switch {
			case !p.IsValid() || a.Zone() != "" || a.Is4In6():
				return fmt.Errorf("%s.ips[%d]: %v is not an IPv4 or IPv6 prefix", f, j, p)
			case a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast():
				return fmt.Errorf("%s.ips[%d]: %v is not a unicast address a claim holds", f, j, p)
			case ips[a]:
				return fmt.Errorf("%s.ips[%d]: %v twice", f, j, a)
			}
			ips[a] = true
		}
	}
	return nil
}

func checkMigrationID(id string) error {
	if id == "" || len(id) > 255 {
		return fmt.Errorf("migration ID of %d bytes, want 1-255", len(id))
	}
	for _, c := range []byte(id) {
		if c < 0x21 || c > 0x7e {
			return errors.New("migration ID has a byte outside printable ASCII")
		}
	}
	return nil
}

// checkNetworkName accepts what KubeVirt accepts as a network name that
// kvnet turns into a claim name: a DNS label.
func checkNetworkName(name string) error {
	if name == "" || len(name) > maxNetworkName {
		return fmt.Errorf("%d bytes, want 1-%d", len(name), maxNetworkName)
	}
	for i, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(name)-1
		if !ok {
			return fmt.Errorf("%q is not a DNS label (lower-case letters, digits, inner '-')", name)
		}
	}
	return nil
}

// MarshalBinary encodes id after validating it.
func (id Identity) MarshalBinary() ([]byte, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	b := appendRoute(append([]byte{}, identityMagic[:]...), id.Route)
	b = append(b, byte(len(id.Networks)))
	for _, n := range id.Networks {
		b = append(b, byte(len(n.Name)))
		b = append(b, n.Name...)
		b = append(b, byte(len(n.NetworkName)))
		b = append(b, n.NetworkName...)
		b = append(b, byte(len(n.MAC)))
		b = append(b, n.MAC...)
		b = append(b, byte(len(n.IPs)))
		for _, p := range n.IPs {
			raw := p.Addr().AsSlice()
			b = append(b, byte(len(raw)))
			b = append(b, raw...)
			b = append(b, byte(p.Bits()))
		}
	}
	return b, nil
}

// readIdentityBody reads the identity after its magic. Every length is
// one byte, so nothing it reads can be larger than 255 bytes at once, and
// counts are checked against their bounds before they are read.
func readIdentityBody(r io.Reader) (Identity, error) {
	rt, err := readRoute(r)
	if err != nil {
		return Identity{}, fmt.Errorf("identity: %w", err)
	}
	id := Identity{Route: rt}
	ir := &identityReader{r: r}
	count, err := ir.byte("network count")
	if err != nil {
		return Identity{}, err
	}
	if count == 0 || count > MaxIdentityNetworks {
		return Identity{}, fmt.Errorf("identity: %d networks, want 1-%d", count, MaxIdentityNetworks)
	}
	for range count {
		nw, err := ir.network()
		if err != nil {
			return Identity{}, err
		}
		id.Networks = append(id.Networks, nw)
	}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// identityReader reads an identity's fields, each named in its errors.
type identityReader struct {
	r   io.Reader
	one [1]byte
}

func (ir *identityReader) byte(what string) (int, error) {
	if _, err := io.ReadFull(ir.r, ir.one[:]); err != nil {
		return 0, fmt.Errorf("identity: %s: %w", what, err)
	}
	return int(ir.one[0]), nil
}

func (ir *identityReader) bytes(what string, n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(ir.r, b); err != nil {
		return nil, fmt.Errorf("identity: %s: %w", what, err)
	}
	return b, nil
}

// network reads one network: its name, its network name, its MAC (none or
// six bytes) and its IPs (at most MaxIdentityIPs).
func (ir *identityReader) network() (NetworkIdentity, error) {
	var nw NetworkIdentity
	n, err := ir.byte("name length")
	if err != nil {
		return nw, err
	}
	if n > maxNetworkName {
		return nw, fmt.Errorf("identity: network name of %d bytes, want at most %d", n, maxNetworkName)
	}
	raw, err := ir.bytes("network name", n)
	if err != nil {
		return nw, err
	}
	nw.Name = string(raw)
	if n, err = ir.byte("network name length"); err != nil {
		return nw, err
	}
	if raw, err = ir.bytes("network name", n); err != nil {
		return nw, err
	}
	nw.NetworkName = string(raw)
	if n, err = ir.byte("MAC length"); err != nil {
		return nw, err
	}
	if n != 0 && n != 6 {
		return nw, fmt.Errorf("identity: network %q: MAC of %d bytes, want none or 6", nw.Name, n)
	}
	if n > 0 {
		if raw, err = ir.bytes("MAC", n); err != nil {
			return nw, err
		}
		nw.MAC = net.HardwareAddr(raw)
	}
	ips, err := ir.byte("IP count")
	if err != nil {
		return nw, err
	}
	if ips > MaxIdentityIPs {
		return nw, fmt.Errorf("identity: network %q: %d IPs, want at most %d", nw.Name, ips, MaxIdentityIPs)
	}
	for range ips {
		p, err := ir.prefix(nw.Name)
		if err != nil {
			return nw, err
		}
		nw.IPs = append(nw.IPs, p)
	}
	return nw, nil
}

// prefix reads one of network's IPs: the address as the claim holds it
// (not its network) and its prefix length.
func (ir *identityReader) prefix(network string) (netip.Prefix, error) {
	n, err := ir.byte("address length")
	if err != nil {
		return netip.Prefix{}, err
	}
	if n != 4 && n != 16 {
		return netip.Prefix{}, fmt.Errorf("identity: network %q: address of %d bytes, want 4 or 16", network, n)
	}
	raw, err := ir.bytes("address", n)
	if err != nil {
		return netip.Prefix{}, err
	}
	bits, err := ir.byte("prefix length")
	if err != nil {
		return netip.Prefix{}, err
	}
	addr, _ := netip.AddrFromSlice(raw)
	if bits > addr.BitLen() {
		return netip.Prefix{}, fmt.Errorf("identity: network %q: prefix length %d for %v", network, bits, addr)
	}
	return netip.PrefixFrom(addr, bits), nil
}
