package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

func TestBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 3: 8 * time.Second, 6: 64 * time.Second, 7: 2 * time.Minute, 40: 2 * time.Minute} {
		if got := backoff(n); got != want {
			t.Errorf("backoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// fixedIdentities is an IdentitySource whose every VMI has one network.
type fixedIdentities struct{}

func (fixedIdentities) IdentityOf(context.Context, *kubevirtv1.VirtualMachineInstance) ([]hop.NetworkIdentity, error) {
	return []hop.NetworkIdentity{{Name: "blue", NetworkName: "tenant-blue", MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9},
		IPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.9/24")}}}, nil
}

// countingIdentities answers each identity with the refusal its VMIM's
// namespace is given (none: accepted) and counts what reached it.
type countingIdentities struct {
	mu     sync.Mutex
	calls  map[string]int
	refuse map[string]*IdentityRefusal
}

func (c *countingIdentities) ReceiveIdentity(_ context.Context, _ string, vmim types.NamespacedName, _ hop.Identity) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[vmim.Namespace]++
	if r := c.refuse[vmim.Namespace]; r != nil {
		return r
	}
	return nil
}

func (c *countingIdentities) count(ns string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[ns]
}

// routeResolver finds, for any migration ID, the receiving VMIM of the
// route's target namespace and VM.
type routeResolver struct{}

func (routeResolver) Resolve(context.Context, string, hop.Route) (Endpoint, bool, error) {
	return Endpoint{}, false, nil
}

func (routeResolver) Receiver(_ context.Context, _ string, rt hop.Route) (types.NamespacedName, types.UID, bool, error) {
	return types.NamespacedName{Namespace: rt.Target.Namespace, Name: rt.Target.Name + "-in"}, types.UID("uid-" + rt.MigrationID), true, nil
}

// The source's offer loop against a real hop listener: a refusal that time
// may lift (the address held) is offered again with a growing backoff and
// not before it, a final one (the identity does not fit) never again, and
// an accepted one not again; each answer is counted by its outcome.
func TestOfferRetriesOnlyWhatMayChange(t *testing.T) {
	self, a := certstest.New(t, "cluster-b"), certstest.New(t, "cluster-a")
	store := &countingIdentities{calls: map[string]int{}, refuse: map[string]*IdentityRefusal{
		"held":  {Reason: hop.RefusedIdentityHeld, Err: errors.New("10.1.0.9 is held")},
		"unfit": {Reason: hop.RefusedIdentityMismatch, Err: errors.New("no NAD")},
	}}
	addr, _ := hopServer(t, &TargetServer{Cert: self.Cert, Peers: []*Peer{{Name: "cluster-a", CAs: a.Pool}}, Resolver: routeResolver{}, Identities: store})
	c := &Controller{Identities: fixedIdentities{}, Peers: []*Peer{{Name: "cluster-b", Addresses: []string{addr}, CAs: self.Pool}},
		Dialer: &Dialer{Cert: a.Cert, Mode: hop.ModeTLS}, Log: logr.Discard()}
	ctx := context.Background()
	vm := func(ns string) (*kubevirtv1.VirtualMachineInstance, *kubevirtv1.VirtualMachineInstanceMigration) {
		return &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"}},
			&kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1-out", UID: types.UID("out-" + ns)},
				Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1",
					SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: "mig-" + ns, ConnectURL: "b:9185"}}}
	}
	outcome := func(o string) float64 { return testutil.ToFloat64(identitiesOffered.WithLabelValues(o)) }

	held, heldOut := vm("held")
	before := outcome(hop.RefusedIdentityHeld.String())
	for i, want := range []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second} {
		res := c.offerIdentity(ctx, held, heldOut)
		if res.RequeueAfter != want || store.count("held") != i+1 {
			t.Fatalf("refusal %d: requeue after %v with %d offers, want %v and %d", i+1, res.RequeueAfter, store.count("held"), want, i+1)
		}
		// Before the backoff has passed (another event on the VMI), no offer.
		if again := c.offerIdentity(ctx, held, heldOut); again.RequeueAfter <= 0 || again.RequeueAfter > want || store.count("held") != i+1 {
			t.Fatalf("within the backoff: requeue after %v with %d offers", again.RequeueAfter, store.count("held"))
		}
		c.mu.Lock()
		st := c.identities[types.NamespacedName{Namespace: "held", Name: "vm1"}]
		st.next = time.Now() // the backoff has passed
		c.identities[types.NamespacedName{Namespace: "held", Name: "vm1"}] = st
		c.mu.Unlock()
	}
	if d := outcome(hop.RefusedIdentityHeld.String()) - before; d != 3 {
		t.Errorf("kvnet_proxy_identities_offered_total{outcome=identity-held} rose by %v, want 3", d)
	}
	// A new sending VMIM for the VMI starts afresh.
	heldOut2 := heldOut.DeepCopy()
	heldOut2.UID = "out-held-2"
	if res := c.offerIdentity(ctx, held, heldOut2); res.RequeueAfter != 2*time.Second {
		t.Errorf("a new sending VMIM: requeue after %v, want the first backoff", res.RequeueAfter)
	}

	unfit, unfitOut := vm("unfit")
	before = outcome(hop.RefusedIdentityMismatch.String())
	for range 3 {
		if res := c.offerIdentity(ctx, unfit, unfitOut); res.RequeueAfter != 0 {
			t.Fatalf("a final refusal: requeue after %v", res.RequeueAfter)
		}
	}
	if store.count("unfit") != 1 || outcome(hop.RefusedIdentityMismatch.String())-before != 1 {
		t.Errorf("a final refusal reached the target %d times and was counted %v times, want once", store.count("unfit"), outcome(hop.RefusedIdentityMismatch.String())-before)
	}

	ok, okOut := vm("fits")
	before = outcome("accepted")
	for range 3 {
		c.offerIdentity(ctx, ok, okOut)
	}
	if store.count("fits") != 1 || outcome("accepted")-before != 1 {
		t.Errorf("an accepted identity reached the target %d times, counted %v times, want once", store.count("fits"), outcome("accepted")-before)
	}
	// The sending VMIM ended: the VMI's state goes.
	c.offerIdentity(ctx, ok, nil)
	if _, kept := c.identities[types.NamespacedName{Namespace: "fits", Name: "vm1"}]; kept {
		t.Error("the offer state outlived the sending VMIM")
	}
}

// streamResolver is routeResolver with one stream endpoint: migration
// mig-victim's, at ep.
type streamResolver struct {
	routeResolver
	ep Endpoint
}

func (r streamResolver) Resolve(_ context.Context, _ string, rt hop.Route) (Endpoint, bool, error) {
	if rt.MigrationID != "mig-victim" {
		return Endpoint{}, false, nil
	}
	return r.ep, true, nil
}

// Attack 5 of issue 43: a tenant's 20 sending VMIMs with IDs nobody
// receives, each offered again as soon as its backoff allows, for five
// rounds (100 offers had they been sent). Every offer is a handshake from
// the proxy's one address, which the target allows 48 at once and then 10
// a second. The namespace's cap sends a handful; another namespace's
// offer still goes at once, and a victim's migration stream, from the same
// address right after, is accepted and carries its bytes.
func TestOffersAreCappedPerNamespace(t *testing.T) {
	self, a := certstest.New(t, "cluster-b"), certstest.New(t, "cluster-a")
	store := &countingIdentities{calls: map[string]int{}, refuse: map[string]*IdentityRefusal{
		"tenant": {Reason: hop.RefusedIdentityHeld, Err: errors.New("held")},
	}}
	echo := echoServer(t)
	port := echo.Addr().(*net.TCPAddr).Port
	addr, refusals := hopServer(t, &TargetServer{Cert: self.Cert, Peers: []*Peer{{Name: "cluster-a", CAs: a.Pool}},
		Resolver: streamResolver{ep: Endpoint{Address: "127.0.0.1", Ports: map[string]int{fmt.Sprint(port): 49152},
			Migration: types.NamespacedName{Namespace: "victim", Name: "vm1-in"}, UID: "victim-in"}},
		Identities: store})
	peer := &Peer{Name: "cluster-b", Addresses: []string{addr}, CAs: self.Pool}
	c := &Controller{Identities: fixedIdentities{}, Peers: []*Peer{peer}, Dialer: &Dialer{Cert: a.Cert, Mode: hop.ModeTLS}, Log: logr.Discard()}
	ctx := context.Background()
	for round := range 5 {
		for i := range 20 {
			vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: fmt.Sprintf("vm%d", i)}}
			vmim := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: vmi.Name + "-out", UID: types.UID(vmi.Name)},
				Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name,
					SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: fmt.Sprintf("random-%d", i), ConnectURL: "b:9185"}}}
			if res := c.offerIdentity(ctx, vmi, vmim); res.RequeueAfter <= 0 {
				t.Fatalf("round %d, %s: not offered again", round, vmi.Name)
			}
			c.mu.Lock() // the backoff has passed
			st := c.identities[types.NamespacedName{Namespace: "tenant", Name: vmi.Name}]
			st.next = time.Time{}
			c.identities[types.NamespacedName{Namespace: "tenant", Name: vmi.Name}] = st
			c.mu.Unlock()
		}
	}
	if got := store.count("tenant"); got > identityOffersPerNamespaceBurst+1 {
		t.Errorf("100 offers of the tenant's VMIMs reached the target %d times, want at most the namespace's burst (%d) and a refill", got, identityOffersPerNamespaceBurst)
	}
	victim := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "vm1"}}
	victimOut := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "vm1-out", UID: "victim-out"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1",
			SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: "mig-victim", ConnectURL: "b:9185"}}}
	if res := c.offerIdentity(ctx, victim, victimOut); res.RequeueAfter != 0 || store.count("victim") != 1 {
		t.Errorf("another namespace's offer: requeue after %v with %d offers, want taken at once", res.RequeueAfter, store.count("victim"))
	}
	conn, err := c.Dialer.Dial(ctx, peer, hop.SameVM("mig-victim", "victim", "vm1"), uint16(port))
	if err != nil {
		t.Fatalf("the victim's stream beside the tenant's offers: %v", err)
	}
	defer conn.Close()
	if err := echoBack(conn, []byte("the victim's migration")); err != nil {
		t.Fatalf("the victim's stream: %v", err)
	}
	for {
		select {
		case r := <-refusals:
			if r == hop.RefusedHandshakeRate {
				t.Fatal("the target refused a handshake for its rate")
			}
			continue
		default:
		}
		return
	}
}
