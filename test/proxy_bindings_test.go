package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/test/framework"
)

// bindingsRig is the target cluster of the binding tests: a control plane
// of its own (so no other test's migrations or proxies are in it), a fake
// target virt-handler port, and three peer identities: cluster-a and
// cluster-c are both trusted peers of the target, cluster-b is the target.
type bindingsRig struct {
	cluster    *framework.Cluster
	echo       *proxyEchoTarget
	pa, pb, pc *certstest.PKI
}

// receive creates a receiving VMIM with migration ID id and its VMI with
// the endpoint the target virt-handler announces, in ns.
func (r *bindingsRig) receive(t *testing.T, ns, name, id string) *kubevirtv1.VirtualMachineInstanceMigration {
	t.Helper()
	ctx := context.Background()
	c := r.cluster.Client
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{}},
	}
	mustCreate(t, c, vmi)
	allocateHandlerAddress(t, c, ns, "node-b", "127.0.0.1")
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-in"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: name,
			Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: id}},
	}
	mustCreate(t, c, vmim)
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduled, MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{
		MigrationUID: vmim.UID,
		TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
			VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "node-b", MigrationUID: vmim.UID},
			NodeAddress: ptr.To("127.0.0.1"), DirectMigrationNodePorts: map[string]int{r.echo.port(): 49152},
		},
	}}
	if err := c.Update(ctx, vmi); err != nil {
		t.Fatalf("announcing the target endpoint of %s: %v", name, err)
	}
	return vmim
}

// runningProxy is one `kvnet proxy` replica of the target cluster.
type runningProxy struct {
	mgr  manager.Manager
	hop  string
	stop func()
}

// start runs a proxy replica in namespace ns (its lease and bindings);
// leaderElect puts it under the lease "kvnet-migration-proxy" of ns. Its
// stop ends it as SIGTERM does (the lease is released).
func (r *bindingsRig) start(t *testing.T, ns string, leaderElect bool) *runningProxy {
	t.Helper()
	hopLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := app.NewProxyManager(r.cluster.Config, app.ProxyOptions{
		AdvertiseAddress: "127.0.0.1", HopListener: hopLn, Cert: r.pb.Cert,
		Peers:       []*proxy.Peer{{Name: "cluster-a", CAs: r.pa.Pool}, {Name: "cluster-c", CAs: r.pc.Pool}},
		MetricsAddr: "0", ProbeAddr: "0", Namespace: ns,
		LeaderElect: leaderElect, LeaderElectionID: "kvnet-migration-proxy", CreateObjects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &runningProxy{mgr: mgr, hop: hopLn.Addr().String(), stop: framework.RunManager(t, mgr)}
}

// dial presents the migration of receiving VMIM m (from the VM of the
// same namespace and name) to proxy p as peer (cluster-a or cluster-c)
// and closes the stream once the verdict is in; nil means accepted.
func (r *bindingsRig) dial(p *runningProxy, peer string, m *kubevirtv1.VirtualMachineInstanceMigration) error {
	cert := r.pa.Cert
	if peer == "cluster-c" {
		cert = r.pc.Cert
	}
	port, _ := strconv.Atoi(r.echo.port())
	target := &proxy.Peer{Name: "cluster-b", Addresses: []string{p.hop}, CAs: r.pb.Pool}
	c, err := (&proxy.Dialer{Cert: cert, Mode: hop.ModeTLS}).Dial(context.Background(), target, hop.SameVM(m.Spec.Receive.MigrationID, m.Namespace, m.Spec.VMIName), uint16(port))
	if err == nil {
		_ = c.Close()
	}
	return err
}

// refusedFor says whether err is the target's refusal r.
func refusedFor(err error, r hop.RefusalCode) bool {
	var re *hop.RefusedError
	return errors.As(err, &re) && re.Reason == r
}

// bindingsOf reads the bindings ConfigMap of ns from the API (not from any
// proxy's cache): what a new leader would find.
func (r *bindingsRig) bindingsOf(t *testing.T, ns string) map[string]store.Binding {
	t.Helper()
	var cm corev1.ConfigMap
	err := r.cluster.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: store.DefaultBindingsName}, &cm)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("reading the bindings ConfigMap: %v", err)
	}
	out := map[string]store.Binding{}
	for k, v := range cm.Data {
		var b store.Binding
		if err := json.Unmarshal([]byte(v), &b); err != nil {
			t.Fatalf("binding %s: %v", k, err)
		}
		out[b.MigrationID] = b
	}
	return out
}

// bindingsGauge reads kvnet_proxy_bindings.
func bindingsGauge(t *testing.T) float64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvnet_proxy_bindings" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("kvnet_proxy_bindings is not exported")
	return 0
}

// waitResolvable waits until proxy p's cache has the receiving VMIM (its
// hop resolves migrations from that cache).
func waitResolvable(t *testing.T, p *runningProxy, vmim *kubevirtv1.VirtualMachineInstanceMigration) {
	t.Helper()
	framework.Eventually(t, "the proxy's cache has "+vmim.Name, framework.CacheTimeout, func() error {
		return p.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(vmim), &kubevirtv1.VirtualMachineInstanceMigration{})
	})
}

// TestProxyBindings shows the target side's migration bindings living in
// the cluster, not in one process: they survive a leader hand-over, hold
// when two replicas accept on the hop at once, and go away when their
// migration ends.
func TestProxyBindings(t *testing.T) {
	b, err := framework.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	rig := &bindingsRig{cluster: b, echo: newProxyEchoTarget(t),
		pa: certstest.New(t, "cluster-a"), pb: certstest.New(t, "cluster-b"), pc: certstest.New(t, "cluster-c")}
	namespace := func(t *testing.T, name string) string {
		mustCreate(t, b.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
		return name
	}

	// The leader binds M to cluster-a and is stopped; the new leader, which
	// never saw that stream, refuses cluster-c for M and accepts cluster-a.
	t.Run("hand-over", func(t *testing.T) {
		ns := namespace(t, "bind-handover")
		vmim := rig.receive(t, ns, "vm1", "mig-handover")
		r1, r2 := rig.start(t, ns, true), rig.start(t, ns, true)
		var leader, next *runningProxy
		select {
		case <-r1.mgr.Elected():
			leader, next = r1, r2
		case <-r2.mgr.Elected():
			leader, next = r2, r1
		case <-time.After(60 * time.Second):
			t.Fatal("no replica took the lease")
		}
		waitResolvable(t, leader, vmim)
		if err := rig.dial(leader, "cluster-a", vmim); err != nil {
			t.Fatalf("the leader refused cluster-a's first stream: %v", err)
		}
		if got := rig.bindingsOf(t, ns)["mig-handover"]; got.Peer != "cluster-a" || got.UID != vmim.UID {
			t.Fatalf("after the verdict the stored binding is %+v, want cluster-a for VMIM %s", got, vmim.UID)
		}
		leader.stop()
		select {
		case <-next.mgr.Elected():
		case <-time.After(60 * time.Second):
			t.Fatal("the second replica never took the lease")
		}
		waitResolvable(t, next, vmim)
		if err := rig.dial(next, "cluster-c", vmim); !refusedFor(err, hop.RefusedOtherPeer) {
			t.Fatalf("the new leader answered cluster-c's stream for a migration bound to cluster-a with %v, want %s", err, hop.RefusedOtherPeer)
		}
		if err := rig.dial(next, "cluster-a", vmim); err != nil {
			t.Fatalf("the new leader refused cluster-a's next stream: %v", err)
		}
	})

	// Two replicas both serving the hop (no lease between them), each
	// presented the same new migration by a different peer at the same
	// moment: exactly one peer wins, on both replicas, and the stored
	// binding names it.
	t.Run("race", func(t *testing.T) {
		ns := namespace(t, "bind-race")
		const n = 12
		var vmims []*kubevirtv1.VirtualMachineInstanceMigration
		for i := range n {
			vmims = append(vmims, rig.receive(t, ns, fmt.Sprintf("vm%d", i), fmt.Sprintf("mig-race-%d", i)))
		}
		r1, r2 := rig.start(t, ns, false), rig.start(t, ns, false)
		for _, m := range vmims {
			waitResolvable(t, r1, m)
			waitResolvable(t, r2, m)
		}
		for i := range n {
			id := fmt.Sprintf("mig-race-%d", i)
			var errA, errC error
			var wg sync.WaitGroup
			start := make(chan struct{})
			wg.Go(func() { <-start; errA = rig.dial(r1, "cluster-a", vmims[i]) })
			wg.Go(func() { <-start; errC = rig.dial(r2, "cluster-c", vmims[i]) })
			close(start)
			wg.Wait()
			winner, loserErr := "cluster-a", errC
			if errA != nil {
				winner, loserErr = "cluster-c", errA
			}
			if (errA == nil) == (errC == nil) {
				t.Fatalf("%s: cluster-a on replica 1: %v; cluster-c on replica 2: %v; want exactly one accepted", id, errA, errC)
			}
			if !refusedFor(loserErr, hop.RefusedOtherPeer) {
				t.Fatalf("%s: the losing peer got %v, want %s", id, loserErr, hop.RefusedOtherPeer)
			}
			if got := rig.bindingsOf(t, ns)[id].Peer; got != winner {
				t.Fatalf("%s: %s was accepted but the stored binding names %q", id, winner, got)
			}
			// The loser is refused on the other replica as well.
			loser, other := "cluster-c", r1
			if winner == "cluster-c" {
				loser, other = "cluster-a", r2
			}
			if err := rig.dial(other, loser, vmims[i]); !refusedFor(err, hop.RefusedOtherPeer) {
				t.Fatalf("%s: %s on the winner's replica got %v, want %s", id, loser, err, hop.RefusedOtherPeer)
			}
		}
		if got := len(rig.bindingsOf(t, ns)); got != n {
			t.Fatalf("%d bindings stored, want %d", got, n)
		}
	})

	// Bindings go when their migration ends, without any peer coming back:
	// a Succeeded VMIM, a Failed one, a deleted one, and one deleted while
	// no proxy ran.
	// The attack of issue 27, item 2, and of issue 43: a tenant copies a
	// victim's migration ID into a receiving VMIM of its own namespace. The
	// victim's source names the victim's namespace, so the copy is never
	// looked at: the victim's stream goes through while the copy lives,
	// and is bound to the victim's VMIM. Two live receiving VMIMs of one
	// ID in the victim's own namespace (which kvnet's admission refuses,
	// not registered here) are refused for both, whatever the list order;
	// once one is gone the other's migration goes through.
	t.Run("copied migration ID", func(t *testing.T) {
		victim, tenant := namespace(t, "bind-victim"), namespace(t, "bind-tenant")
		v := rig.receive(t, victim, "vm1", "mig-copied")
		copied := rig.receive(t, tenant, "vm1", "mig-copied")
		twin := rig.receive(t, victim, "vm2", "mig-copied-twice")
		twinCopy := rig.receive(t, victim, "vm3", "mig-copied-twice")
		p := rig.start(t, victim, false)
		for _, m := range []*kubevirtv1.VirtualMachineInstanceMigration{v, copied, twin, twinCopy} {
			waitResolvable(t, p, m)
		}
		if err := rig.dial(p, "cluster-a", v); err != nil {
			t.Fatalf("the victim's stream beside a copy of its ID in another namespace: %v", err)
		}
		if got := rig.bindingsOf(t, victim)["mig-copied"]; got.Namespace != victim || got.UID != v.UID {
			t.Fatalf("the migration is bound to %+v, want the victim's VMIM %s/%s", got, victim, v.Name)
		}
		before := proxyRefusals(t, hop.RefusedAmbiguousMigration)
		if err := rig.dial(p, "cluster-a", twin); !refusedFor(err, hop.RefusedAmbiguousMigration) {
			t.Fatalf("a migration ID held by two receiving VMIMs of one namespace: got %v, want the refusal %s", err, hop.RefusedAmbiguousMigration)
		}
		if d := proxyRefusals(t, hop.RefusedAmbiguousMigration) - before; d != 1 {
			t.Errorf("kvnet_proxy_refused_total{reason=%s} rose by %v, want 1", hop.RefusedAmbiguousMigration, d)
		}
		if err := b.Client.Delete(context.Background(), twinCopy); err != nil {
			t.Fatal(err)
		}
		framework.Eventually(t, "the copy gone from the proxy's cache", framework.CacheTimeout, func() error {
			err := p.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(twinCopy), &kubevirtv1.VirtualMachineInstanceMigration{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("still cached (%v)", err)
		})
		if err := rig.dial(p, "cluster-a", twin); err != nil {
			t.Fatalf("the stream once the copy is gone: %v", err)
		}
	})

	// A VMI status (writable by whoever creates the VMI) that announces
	// more ports than KubeVirt opens, or ports to other libvirt ports, is
	// dialled at none of them.
	t.Run("ports not KubeVirt's", func(t *testing.T) {
		ns := namespace(t, "bind-ports")
		vmim := rig.receive(t, ns, "vm1", "mig-ports")
		var vmi kubevirtv1.VirtualMachineInstance
		if err := b.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "vm1"}, &vmi); err != nil {
			t.Fatal(err)
		}
		ports := vmi.Status.MigrationState.TargetState.DirectMigrationNodePorts
		ports["6443"], ports["2379"], ports["10250"] = 0, 49153, 49154
		if err := b.Client.Update(context.Background(), &vmi); err != nil {
			t.Fatal(err)
		}
		p := rig.start(t, ns, false)
		waitResolvable(t, p, vmim)
		framework.Eventually(t, "the proxy's cache has the tenant's ports", framework.CacheTimeout, func() error {
			var cur kubevirtv1.VirtualMachineInstance
			if err := p.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(&vmi), &cur); err != nil {
				return err
			}
			if n := len(cur.Status.MigrationState.TargetState.DirectMigrationNodePorts); n != 4 {
				return fmt.Errorf("%d ports", n)
			}
			return nil
		})
		before := proxyRefusals(t, hop.RefusedBadPorts)
		if err := rig.dial(p, "cluster-a", vmim); !refusedFor(err, hop.RefusedBadPorts) {
			t.Fatalf("four announced ports: got %v, want the refusal %s", err, hop.RefusedBadPorts)
		}
		if d := proxyRefusals(t, hop.RefusedBadPorts) - before; d != 1 {
			t.Errorf("kvnet_proxy_refused_total{reason=%s} rose by %v, want 1", hop.RefusedBadPorts, d)
		}
	})

	// A tenant's VMI status aims the target proxy at a host of its choice
	// (here a listener on another loopback address, standing for the API
	// server or any in-cluster service). The proxy dials only the address
	// kvnet gave the virt-handler on the node the status names, so it
	// refuses; a status that names a node without one is refused too.
	t.Run("target not a virt-handler", func(t *testing.T) {
		ns := namespace(t, "bind-steer")
		vmim := rig.receive(t, ns, "vm1", "mig-steer")
		var vmi kubevirtv1.VirtualMachineInstance
		if err := b.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "vm1"}, &vmi); err != nil {
			t.Fatal(err)
		}
		elsewhere, err := net.Listen("tcp", "127.0.0.2:"+rig.echo.port())
		if err != nil {
			t.Fatal(err)
		}
		defer elsewhere.Close()
		dialled := make(chan struct{}, 1)
		go func() {
			if c, err := elsewhere.Accept(); err == nil {
				dialled <- struct{}{}
				_ = c.Close()
			}
		}()
		vmi.Status.MigrationState.TargetState.NodeAddress = ptr.To("127.0.0.2")
		if err := b.Client.Update(context.Background(), &vmi); err != nil {
			t.Fatal(err)
		}
		p := rig.start(t, ns, false)
		waitResolvable(t, p, vmim)
		announced := func(node, addr string) {
			framework.Eventually(t, "the proxy's cache has the tenant's status", framework.CacheTimeout, func() error {
				var cur kubevirtv1.VirtualMachineInstance
				if err := p.mgr.GetCache().Get(context.Background(), client.ObjectKeyFromObject(&vmi), &cur); err != nil {
					return err
				}
				if ts := cur.Status.MigrationState.TargetState; ts.Node != node || *ts.NodeAddress != addr {
					return fmt.Errorf("node %s, address %s", ts.Node, *ts.NodeAddress)
				}
				return nil
			})
		}
		announced("node-b", "127.0.0.2")
		before := proxyRefusals(t, hop.RefusedTargetNotHandler)
		if err := rig.dial(p, "cluster-a", vmim); !refusedFor(err, hop.RefusedTargetNotHandler) {
			t.Fatalf("a status announcing another host: got %v, want the refusal %s", err, hop.RefusedTargetNotHandler)
		}
		vmi.Status.MigrationState.TargetState.Node = "node-without-handler"
		if err := b.Client.Update(context.Background(), &vmi); err != nil {
			t.Fatal(err)
		}
		announced("node-without-handler", "127.0.0.2")
		if err := rig.dial(p, "cluster-a", vmim); !refusedFor(err, hop.RefusedTargetNotHandler) {
			t.Fatalf("a status naming a node kvnet gave no address: got %v, want the refusal %s", err, hop.RefusedTargetNotHandler)
		}
		if d := proxyRefusals(t, hop.RefusedTargetNotHandler) - before; d != 2 {
			t.Errorf("kvnet_proxy_refused_total{reason=%s} rose by %v, want 2", hop.RefusedTargetNotHandler, d)
		}
		select {
		case <-dialled:
			t.Fatal("the target proxy dialled the host the tenant's status named")
		default:
		}
	})

	t.Run("shrink", func(t *testing.T) {
		ns := namespace(t, "bind-shrink")
		ctx := context.Background()
		ids := []string{"mig-succeeds", "mig-fails", "mig-deleted", "mig-deleted-while-down"}
		vmims := map[string]*kubevirtv1.VirtualMachineInstanceMigration{}
		for i, id := range ids {
			vmims[id] = rig.receive(t, ns, fmt.Sprintf("vm%d", i), id)
		}
		p := rig.start(t, ns, true)
		for _, id := range ids {
			waitResolvable(t, p, vmims[id])
			if err := rig.dial(p, "cluster-a", vmims[id]); err != nil {
				t.Fatalf("binding %s: %v", id, err)
			}
		}
		held := func(want ...string) func() error {
			return func() error {
				got := rig.bindingsOf(t, ns)
				if !sameKeys(got, want) {
					return fmt.Errorf("bindings held: %v, want %v", slices.Sorted(maps.Keys(got)), want)
				}
				if g := bindingsGauge(t); g != float64(len(want)) {
					return fmt.Errorf("kvnet_proxy_bindings is %v, want %d", g, len(want))
				}
				return nil
			}
		}
		framework.Eventually(t, "four bindings", framework.CacheTimeout, held(ids...))

		phase := func(id string, ph kubevirtv1.VirtualMachineInstanceMigrationPhase) {
			m := vmims[id]
			if err := b.Client.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
				t.Fatal(err)
			}
			m.Status.Phase = ph
			if err := b.Client.Status().Update(ctx, m); err != nil {
				t.Fatalf("setting %s to %s: %v", m.Name, ph, err)
			}
		}
		phase("mig-succeeds", kubevirtv1.MigrationSucceeded)
		framework.Eventually(t, "the Succeeded migration's binding removed", framework.CacheTimeout, held(ids[1:]...))
		phase("mig-fails", kubevirtv1.MigrationFailed)
		framework.Eventually(t, "the Failed migration's binding removed", framework.CacheTimeout, held(ids[2:]...))
		if err := b.Client.Delete(ctx, vmims["mig-deleted"]); err != nil {
			t.Fatal(err)
		}
		framework.Eventually(t, "the deleted migration's binding removed", framework.CacheTimeout, held(ids[3:]...))

		// The proxy is down while the last VMIM is deleted: the next one
		// finds the binding at start and removes it.
		p.stop()
		if err := b.Client.Delete(ctx, vmims["mig-deleted-while-down"]); err != nil {
			t.Fatal(err)
		}
		if got := rig.bindingsOf(t, ns); len(got) != 1 {
			t.Fatalf("with no proxy running the binding is already gone: %v", got)
		}
		rig.start(t, ns, true)
		framework.Eventually(t, "the binding of the migration deleted while no proxy ran removed", framework.CacheTimeout, held())
	})
}

func sameKeys(m map[string]store.Binding, want []string) bool {
	if len(m) != len(want) {
		return false
	}
	for _, k := range want {
		if _, ok := m[k]; !ok {
			return false
		}
	}
	return true
}

// proxyRefusals is the target side's kvnet_proxy_refused_total for r.
func proxyRefusals(t *testing.T, r hop.RefusalCode) float64 {
	t.Helper()
	return metricValue(t, "kvnet_proxy_refused_total", map[string]string{"side": "target", "reason": r.String()})
}

// allocateHandlerAddress writes, in namespace ns (the proxy's, standing for
// kvnet's), the allocation kvnet makes when it gives node's virt-handler
// addr on the in-cluster migration network: the only address the target
// proxy dials for that node. An allocation already there is kept.
func allocateHandlerAddress(t *testing.T, c client.Client, ns, node, addr string) {
	t.Helper()
	a := &migration.Allocation{Pool: migration.PoolInCluster, Address: netip.MustParseAddr(addr), PrefixLength: 24,
		State: migration.StateBound, Node: node, PodNamespace: framework.KubeVirtNamespace, PodName: "virt-handler-" + node, PodUID: types.UID("uid-" + node)}
	if err := c.Create(context.Background(), a.ToConfigMap(ns)); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("allocating %s to the virt-handler on %s: %v", addr, node, err)
	}
}
