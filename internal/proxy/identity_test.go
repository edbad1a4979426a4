package proxy

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// recordingIdentities is the hop's IdentityReceiver for tests.
type recordingIdentities struct {
	mu     sync.Mutex
	got    map[types.NamespacedName]hop.Identity
	refuse error
}

func (r *recordingIdentities) ReceiveIdentity(_ context.Context, _ string, vmim types.NamespacedName, id hop.Identity) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.refuse != nil {
		return r.refuse
	}
	if r.got == nil {
		r.got = map[types.NamespacedName]hop.Identity{}
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
	fromA, fromC := &Dialer{Cert: a.Cert, Mode: hop.ModeTLS}, &Dialer{Cert: c.Cert, Mode: hop.ModeTLS}
	refusedWith := func(err error, want hop.RefusalCode) {
		t.Helper()
		var ref *hop.RefusedError
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
	refusedWith(fromC.OfferIdentity(context.Background(), to, blueIdentity("mig-1")), hop.RefusedOtherPeer)
	refusedWith(fromA.OfferIdentity(context.Background(), to, blueIdentity("mig-unknown")), hop.RefusedUnknownMigration)

	store.mu.Lock()
	store.refuse = &IdentityRefusal{Reason: hop.RefusedIdentityMismatch, Err: errors.New("no NAD for network blue")}
	store.mu.Unlock()
	refusedWith(fromC.OfferIdentity(context.Background(), to, blueIdentity("mig-2")), hop.RefusedIdentityMismatch)

	off := &TargetServer{Cert: self.Cert, Peers: ts.Peers, Resolver: ts.Resolver}
	offAddr, _ := hopServer(t, off)
	refusedWith(fromA.OfferIdentity(context.Background(), &Peer{Name: "cluster-b", Addresses: []string{offAddr}, CAs: self.Pool}, blueIdentity("mig-1")), hop.RefusedIdentityOff)
}
