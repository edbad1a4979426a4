package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kvnet/kvnet/certs/certstest"
)

func blueIdentity(id string) Identity {
	return Identity{Route: testRoute(id), Networks: []NetworkIdentity{
		{Name: "blue", NetworkName: "tenant-blue", MAC: net.HardwareAddr{0x02, 0x00, 0x00, 0x0a, 0x01, 0x05},
			IPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.5/24"), netip.MustParsePrefix("fd00:1::5/64")}},
	}}
}

// What a peer may send is bounded and checked field by field, on both
// ends: the source does not offer, nor the target read, an identity that
// names a network KubeVirt would not, or IPs no claim holds.
func TestIdentityValidate(t *testing.T) {
	ok := blueIdentity("mig-1")
	if err := ok.Validate(); err != nil {
		t.Fatalf("a valid identity: %v", err)
	}
	with := func(f func(*Identity)) Identity {
		id := blueIdentity("mig-1")
		id.Networks = append([]NetworkIdentity{}, id.Networks...)
		id.Networks[0].IPs = append([]netip.Prefix{}, id.Networks[0].IPs...)
		f(&id)
		return id
	}
	many := func(n int) []NetworkIdentity {
		var out []NetworkIdentity
		for i := range n {
			out = append(out, NetworkIdentity{Name: "n" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + string(rune('a'+i/26)), NetworkName: "net"})
		}
		return out
	}
	for want, id := range map[string]Identity{
		"migration ID of 0 bytes":            with(func(id *Identity) { id.MigrationID = "" }),
		"outside printable ASCII":            with(func(id *Identity) { id.MigrationID = "mig 1" }),
		"0 networks":                         with(func(id *Identity) { id.Networks = nil }),
		"33 networks":                        with(func(id *Identity) { id.Networks = many(33) }),
		"networks[0].name: \"Blue\" is not":  with(func(id *Identity) { id.Networks[0].Name = "Blue" }),
		"networks[0].name: \"-blue\" is not": with(func(id *Identity) { id.Networks[0].Name = "-blue" }),
		"networks[1].name: \"blue\" twice":   with(func(id *Identity) { id.Networks = append(id.Networks, NetworkIdentity{Name: "blue", NetworkName: "x"}) }),
		"networks[0].networkName: 0 bytes":   with(func(id *Identity) { id.Networks[0].NetworkName = "" }),
		"networks[0].mac: 4 bytes":           with(func(id *Identity) { id.Networks[0].MAC = net.HardwareAddr{2, 0, 0, 1} }),
		"multicast":                          with(func(id *Identity) { id.Networks[0].MAC = net.HardwareAddr{1, 0, 0x5e, 0, 0, 1} }),
		"networks[0].ips[2]: 10.1.0.5 twice": with(func(id *Identity) {
			id.Networks[0].IPs = append(id.Networks[0].IPs, netip.MustParsePrefix("10.1.0.5/16"))
		}),
		"127.0.0.1/8 is not a unicast":       with(func(id *Identity) { id.Networks[0].IPs[0] = netip.MustParsePrefix("127.0.0.1/8") }),
		"fe80::1/64 is not a unicast":        with(func(id *Identity) { id.Networks[0].IPs[1] = netip.MustParsePrefix("fe80::1/64") }),
		"::ffff:10.1.0.5/120 is not an IPv4": with(func(id *Identity) { id.Networks[0].IPs[0] = netip.MustParsePrefix("::ffff:10.1.0.5/120") }),
		"networks[0].ips: 9, want at most 8": with(func(id *Identity) {
			for i := range 7 {
				id.Networks[0].IPs = append(id.Networks[0].IPs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 2, 0, byte(i + 1)}), 24))
			}
		}),
	} {
		err := id.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error saying %q", err, want)
		}
		if _, err := id.MarshalBinary(); err == nil {
			t.Errorf("%q: an invalid identity encoded", want)
		}
	}
}

// recordingIdentities is the hop's IdentityReceiver for tests.
type recordingIdentities struct {
	mu     sync.Mutex
	got    map[types.NamespacedName]Identity
	refuse error
}

func (r *recordingIdentities) ReceiveIdentity(_ context.Context, _ string, vmim types.NamespacedName, id Identity) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse != nil {
		return r.refuse
	}
	if r.got == nil {
		r.got = map[types.NamespacedName]Identity{}
	}
	r.got[vmim] = id
	return nil
}

// An identity goes over the hop only to a receiving VMIM of the migration
// it names and only from the peer that migration is bound to: a second
// peer, even one this cluster trusts, cannot give the receiving VM other
// addresses, and what the receiver refuses reaches the source as such.
func TestIdentityOnlyFromTheBoundPeer(t *testing.T) {
	self := certstest.New(t, "cluster-b")
	a, c := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-c")
	store := &recordingIdentities{}
	vmim := types.NamespacedName{Namespace: "tenant", Name: "vm1-in"}
	ts := &TargetServer{Cert: self.Cert, Peers: []*Peer{{Name: "cluster-a", CAs: a.Pool}, {Name: "cluster-c", CAs: c.Pool}},
		Resolver:   &staticResolver{eps: map[string]Endpoint{"mig-1": {Migration: vmim, UID: "u1"}, "mig-2": {Migration: types.NamespacedName{Namespace: "tenant", Name: "vm2-in"}}}},
		Identities: store}
	addr, _ := hopServer(t, ts)
	to := &Peer{Name: "cluster-b", Addresses: []string{addr}, CAs: self.Pool}
	fromA, fromC := &Dialer{Cert: a.Cert, Mode: ModeTLS}, &Dialer{Cert: c.Cert, Mode: ModeTLS}
	refusedWith := func(err error, want RefusalCode) {
		t.Helper()
		var ref *RefusedError
		if !errors.As(err, &ref) || ref.Reason != want {
			t.Fatalf("got %v, want refused %s", err, want)
		}
	}

	if err := fromA.OfferIdentity(context.Background(), to, blueIdentity("mig-1")); err != nil {
		t.Fatalf("the first peer's identity: %v", err)
	}
	store.mu.Lock()
	got, ok := store.got[vmim]
	store.mu.Unlock()
	if !ok || got.Networks[0].NetworkName != "tenant-blue" || got.Networks[0].MAC.String() != "02:00:00:0a:01:05" || got.Networks[0].IPs[1] != netip.MustParsePrefix("fd00:1::5/64") {
		t.Fatalf("the receiver got %+v for %s, want the identity sent", got, vmim)
	}
	// The migration is now cluster-a's: cluster-c, trusted as a peer,
	// may neither overwrite its identity nor stream it.
	refusedWith(fromC.OfferIdentity(context.Background(), to, blueIdentity("mig-1")), RefusedOtherPeer)
	refusedWith(fromA.OfferIdentity(context.Background(), to, blueIdentity("mig-unknown")), RefusedUnknownMigration)

	store.mu.Lock()
	store.refuse = &IdentityRefusal{Reason: RefusedIdentityMismatch, Err: errors.New("no NAD for network blue")}
	store.mu.Unlock()
	refusedWith(fromC.OfferIdentity(context.Background(), to, blueIdentity("mig-2")), RefusedIdentityMismatch)

	off := &TargetServer{Cert: self.Cert, Peers: ts.Peers, Resolver: ts.Resolver}
	offAddr, _ := hopServer(t, off)
	refusedWith(fromA.OfferIdentity(context.Background(), &Peer{Name: "cluster-b", Addresses: []string{offAddr}, CAs: self.Pool}, blueIdentity("mig-1")), RefusedIdentityOff)
}
