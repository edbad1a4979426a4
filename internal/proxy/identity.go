package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
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

// IdentityReceiver takes a migration's network identity for the receiving
// VMIM it belongs to: it checks it against this cluster (network names,
// subnets, IPs in use, the target pod not yet there) and stores it where
// the target pod's admission finds it. A check that fails is an
// *IdentityRefusal; any other error is the store's.
type IdentityReceiver interface {
	ReceiveIdentity(ctx context.Context, peer string, vmim types.NamespacedName, id Identity) error
}

// IdentityRefusal is an identity this cluster cannot honour; the source
// hears Reason and the migration does not start.
type IdentityRefusal struct {
	Reason RefusalCode
	Err    error
}

func (e *IdentityRefusal) Error() string { return e.Reason.String() + ": " + e.Err.Error() }
func (e *IdentityRefusal) Unwrap() error { return e.Err }

// ReceiverFinder finds the live receiving VMIM of a route, as Resolver
// does, without waiting for its target endpoint: an identity travels
// before the target pod, and so its endpoint, exists. ClusterResolver
// implements it.
type ReceiverFinder interface {
	Receiver(ctx context.Context, peer string, route Route) (vmim types.NamespacedName, uid types.UID, ok bool, err error)
}

// receiveIdentity answers a peer's identity offer. Only a receiving VMIM
// of this cluster with that migration ID takes one, and only from the
// peer the migration is bound to: the first peer to present the ID, by
// identity or by stream, holds it (Bindings), so no other peer can give
// the receiving VM other addresses. The VMIM must be the route's target
// and take its source (Route): a refusal there binds nothing and writes
// nothing.
func (s *TargetServer) receiveIdentity(ctx context.Context, log logr.Logger, peer *Peer, conn net.Conn, id *Identity) {
	log = log.WithValues("request", "identity", "migrationID", id.MigrationID, "source", id.Source.String(), "target", id.Target.String())
	deny := func(r RefusalCode, err error) {
		s.refuse(log, peer.Name, r, err)
		_, _ = conn.Write([]byte{byte(r)})
	}
	finder, ok := s.Resolver.(ReceiverFinder)
	if s.Identities == nil || !ok {
		deny(RefusedIdentityOff, nil)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout))
	defer cancel()
	vmim, uid, found, err := finder.Receiver(ctx, peer.Name, id.Route)
	if r, err := lookupVerdict(found, err); r != accepted {
		deny(r, err)
		return
	}
	bound, err := s.Bindings.Bind(ctx, Binding{MigrationID: id.MigrationID, Peer: peer.Name, Namespace: vmim.Namespace, VMIM: vmim.Name, UID: uid})
	if r, err := bindVerdict(bound, err); r != accepted {
		deny(r, err)
		return
	}
	var ir *IdentityRefusal
	if err := s.Identities.ReceiveIdentity(ctx, peer.Name, vmim, *id); errors.As(err, &ir) {
		deny(ir.Reason, ir.Err)
		return
	} else if err != nil {
		deny(RefusedIdentityStore, err)
		return
	}
	log.Info("took a migration's network identity", "peer", peer.Name, "vmim", vmim.String(), "networks", len(id.Networks))
	_, _ = conn.Write([]byte{byte(accepted)})
}

// OfferIdentity sends id to peer over the hop, inside TLS, and returns
// once the peer answered that it took it (or why not: a *RefusedError).
func (d *Dialer) OfferIdentity(ctx context.Context, peer *Peer, id Identity) error {
	req, err := id.MarshalBinary()
	if err != nil {
		return err
	}
	return d.offer(ctx, peer, req, "the identity")
}
