package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/test/framework"
)

// identityTarget is the target cluster of a cross-cluster migration with
// kvnet in it (the suite's control plane: its webhooks and claim
// controller), its proxy's hop, and the peers' dialers.
type identityTarget struct {
	ns, network string
	hop         *proxy.Peer
	fromA       *proxy.Dialer // the source cluster's proxy, the one peer a migration binds to first
	fromC       *proxy.Dialer // another trusted peer
}

// startIdentityTarget starts the target's `kvnet proxy` on the suite's
// control plane with peers cluster-a and cluster-c, and a namespace with a
// layer2 NAD that keeps persistent IPs on 10.100.0.0/24. The network name
// is the namespace's, so the held check sees no other test's claims.
func startIdentityTarget(t *testing.T) *identityTarget {
	t.Helper()
	hopAddr := loopbackAddr(t, 6)
	pa, pb, pc := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b"), certstest.New(t, "cluster-c")
	hopLn, err := net.Listen("tcp", net.JoinHostPort(hopAddr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := app.NewProxyManager(env.Config, app.ProxyOptions{
		AdvertiseAddress: hopAddr, HopListener: hopLn, Cert: pb.Cert, ReceiveIdentities: true,
		Peers:       []*proxy.Peer{{Name: "cluster-a", CAs: pa.Pool}, {Name: "cluster-c", CAs: pc.Pool}},
		MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startProxy(t, mgr)
	ns := env.NewNamespace(t, nil)
	it := &identityTarget{ns: ns, network: "blue-" + ns,
		hop:   &proxy.Peer{Name: "cluster-b", Addresses: []string{hopLn.Addr().String()}, CAs: pb.Pool},
		fromA: &proxy.Dialer{Cert: pa.Cert, Mode: hop.ModeTLS}, fromC: &proxy.Dialer{Cert: pc.Cert, Mode: hop.ModeTLS}}
	piPersistentNAD(t, ns, "blue", it.network)
	return it
}

// receive creates what KubeVirt has in the target cluster before the
// source VMIM exists: the WaitAsReceiver VM, the receiving VMI it starts
// (no pod), and the receive VMIM for migration ID ns-name. kvnet's
// controller gives the VM its (empty) claim, as for any VM.
func (it *identityTarget) receive(t *testing.T, name string) (*kubevirtv1.VirtualMachineInstance, *kubevirtv1.VirtualMachineInstanceMigration) {
	t.Helper()
	vm := piVmWithNetworks(it.ns, name, [2]string{"blue", "blue"})
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyWaitAsReceiver)
	piCreateVM(t, vm)
	vmi := piStartVMI(t, vm)
	piWaitClaim(t, it.ns, name+".blue", "VirtualMachine", name, vm.UID, it.network, "blue")
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: it.ns, Name: name + "-in"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: name,
			Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: it.ns + "-" + name}},
	}
	mustCreate(t, env.Client, vmim)
	return vmi, vmim
}

// identity is what the source proxy sends for a VM with one network blue.
func (it *identityTarget) identity(vmim *kubevirtv1.VirtualMachineInstanceMigration, network string, ips ...string) hop.Identity {
	n := hop.NetworkIdentity{Name: "blue", NetworkName: network, MAC: net.HardwareAddr{0x02, 0x6b, 0x76, 0x00, 0x00, 0x05}}
	for _, ip := range ips {
		n.IPs = append(n.IPs, netip.MustParsePrefix(ip))
	}
	return hop.Identity{Route: hop.SameVM(vmim.Spec.Receive.MigrationID, vmim.Namespace, vmim.Spec.VMIName), Networks: []hop.NetworkIdentity{n}}
}

// offer sends id from d, waiting out unknown-migration while the target
// proxy's cache has not seen the VMIM yet; it returns the refusal, if any.
func (it *identityTarget) offer(t *testing.T, d *proxy.Dialer, id hop.Identity) hop.RefusalCode {
	t.Helper()
	var got hop.RefusalCode
	proxyEventually(t, "the target proxy answers the identity for "+id.MigrationID, func() error {
		err := d.OfferIdentity(context.Background(), it.hop, id)
		var re *hop.RefusedError
		switch {
		case err == nil:
			got = 0
		case !errors.As(err, &re):
			t.Fatalf("offering the identity: %v", err)
		case re.Reason == hop.RefusedUnknownMigration:
			return err
		default:
			got = re.Reason
		}
		return nil
	})
	return got
}

// refused offers id and wants reason back, counted on the target side, a
// Warning event saying why on the receive VMIM (when the receiver refused
// it, not the hop), and the claim left as it was.
// outcome is kvnet_persistentips_identities_received_total's label ("" when
// the hop refuses before the receiver); an outcome's event is a series
// that keeps its first note, so says is checked once per outcome.
func (it *identityTarget) refused(t *testing.T, what string, d *proxy.Dialer, vmim *kubevirtv1.VirtualMachineInstanceMigration, id hop.Identity, reason hop.RefusalCode, outcome, says string) {
	t.Helper()
	received := map[string]string{"outcome": outcome}
	before, outcomes := refusedCount(t, "target", reason), metricValue(t, "kvnet_persistentips_identities_received_total", received)
	claim, _ := piGetClaim(it.ns, vmim.Spec.VMIName+".blue")
	if got := it.offer(t, d, id); got != reason {
		t.Fatalf("%s: got refusal %q, want %s", what, got, reason)
	}
	if after := refusedCount(t, "target", reason); after < before+1 {
		t.Errorf("%s: kvnet_proxy_refused_total{side=target,reason=%s} %v -> %v", what, reason, before, after)
	}
	if after, _ := piGetClaim(it.ns, claim.Name); after.ResourceVersion != claim.ResourceVersion {
		t.Errorf("%s: the claim changed: status %v annotations %v", what, after.Status.IPs, after.Annotations)
	}
	if outcome != "" {
		if after := metricValue(t, "kvnet_persistentips_identities_received_total", received); after != outcomes+1 {
			t.Errorf("%s: kvnet_persistentips_identities_received_total{outcome=%s} %v -> %v", what, outcome, outcomes, after)
		}
	}
	if says != "" {
		identityEvent(t, vmim, corev1.EventTypeWarning, "NetworkIdentityRefused", says)
	}
}

// identityEvent waits for an event of reason on the VMIM whose note says
// says.
func identityEvent(t *testing.T, vmim *kubevirtv1.VirtualMachineInstanceMigration, typ, reason, says string) {
	t.Helper()
	piEventually(t, fmt.Sprintf("a %s event saying %q on VMIM %s", reason, says, vmim.Name), func() error {
		var evs eventsv1.EventList
		if err := env.Client.List(context.Background(), &evs, client.InNamespace(vmim.Namespace)); err != nil {
			return err
		}
		var notes []string
		for _, e := range evs.Items {
			if e.Regarding.Kind == "VirtualMachineInstanceMigration" && e.Regarding.Name == vmim.Name && e.Reason == reason && e.Type == typ {
				if strings.Contains(e.Note, says) {
					return nil
				}
				notes = append(notes, e.Note)
			}
		}
		return fmt.Errorf("%s events: %q", reason, notes)
	})
}

// targetPod is the launcher pod virt-controller's createTargetPod makes
// for a migration: the VMI's launcher pod with the migration's UID label
// and name annotation.
func targetPod(vmi *kubevirtv1.VirtualMachineInstance, vmim *kubevirtv1.VirtualMachineInstanceMigration) *corev1.Pod {
	pod := piLauncherPod(vmi)
	pod.Labels[kubevirtv1.MigrationJobLabel] = string(vmim.UID)
	pod.Annotations[kubevirtv1.MigrationJobNameAnnotation] = vmim.Name
	return pod
}

// The target side of a migration's network identity (issue 30): the
// receiving VM's claim takes the source's IPs and MAC once, before its
// target pod exists, and every identity this cluster cannot honour is
// refused back over the hop with the claim untouched: another network
// name, an IP outside the NAD's subnets, an IP a claim or a pod already
// holds here, a second peer, and one that comes after the target pod.
func TestIdentityTargetSide(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	it := startIdentityTarget(t)
	vmi, vmim := it.receive(t, "vm1")

	// Held in the target: a claim of another VM on the same network (in
	// another namespace), and a pod whose network-status has an address.
	other := env.NewNamespace(t, nil)
	heldClaim(t, other, it.network, "10.100.0.7/24")
	piPersistentNAD(t, other, "blue", it.network)
	web := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "web", Annotations: map[string]string{
			multus.NetworksAnnotation:      other + "/blue",
			multus.NetworkStatusAnnotation: `[{"name":"ovn-kubernetes","ips":["10.244.0.8"],"default":true},{"name":"` + other + `/blue","interface":"net1","ips":["10.100.0.8"]}]`,
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	}
	mustCreate(t, env.Client, web)
	// A tenant's pod whose network-status it wrote itself (issue 43,
	// attack 3): the address the victim's identity brings, on the blue NAD
	// the pod never asked for, and on a NAD that does not exist. Neither
	// counts, so the identity is taken below.
	forger := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "forger", Annotations: map[string]string{
			multus.NetworkStatusAnnotation: `[{"name":"` + other + `/blue","interface":"net1","ips":["10.100.0.5"]},{"name":"` + other + `/gone","interface":"net2","ips":["10.100.0.5"]}]`,
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "forger", Image: "forger"}}},
	}
	mustCreate(t, env.Client, forger)

	for _, c := range []struct {
		what, outcome, says string
		id                  hop.Identity
		reason              hop.RefusalCode
	}{
		{"another network name", persistentips.ReasonNetworkName, `networks[blue].networkName: "red"`, it.identity(vmim, "red", "10.100.0.5/24"), hop.RefusedIdentityMismatch},
		{"an IP outside the subnets", persistentips.ReasonOutsideSubnets, "networks[blue].ips: 10.100.1.5/24 is in no subnet", it.identity(vmim, it.network, "10.100.1.5/24"), hop.RefusedIdentityMismatch},
		{"an IP a claim holds", persistentips.ReasonHeld, fmt.Sprintf("10.100.0.7 is already held on network %q by an IPAMClaim in another namespace", it.network), it.identity(vmim, it.network, "10.100.0.7/24"), hop.RefusedIdentityHeld},
	} {
		it.refused(t, c.what, it.fromA, vmim, c.id, c.reason, c.outcome, c.says)
	}
	// The event names no object of another namespace; the log names it
	// for the cluster admin.
	if n := env.Logs.Count("refused a migration's network identity", "holder", "IPAMClaim "+other+"/app.blue"); n < 1 {
		t.Errorf("no log line names the claim that holds the address")
	}
	// Another receiving VM, so that its event is not the series above.
	vmi2, vmim2 := it.receive(t, "vm2")
	// A migration inside this cluster (no spec.receive) is not held back:
	// its claim is filled when OVN-Kubernetes allocates for the source pod.
	local := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: it.ns, Name: "vm2-local"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm2"}}
	mustCreate(t, env.Client, local)
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstance{}, client.ObjectKeyFromObject(vmi2))
	mustCreate(t, env.Client, targetPod(vmi2, local))
	it.refused(t, "an IP a pod holds", it.fromA, vmim2, it.identity(vmim2, it.network, "10.100.0.8/24"), hop.RefusedIdentityHeld,
		persistentips.ReasonHeld, fmt.Sprintf("10.100.0.8 is already held on network %q by a pod in another namespace", it.network))
	// The migration is cluster-a's now (its first identity bound it):
	// cluster-c, trusted as a peer, cannot give the VM other addresses.
	it.refused(t, "a peer the migration is not bound to", it.fromC, vmim, it.identity(vmim, it.network, "10.100.0.5/24"), hop.RefusedOtherPeer, "", "")

	// Before the identity is in, the target pod is denied (virt-controller
	// retries), so it never gets a fresh IP.
	waiting := metricValue(t, "kvnet_launcher_target_pods_waiting_for_identity_total", nil)
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstance{}, client.ObjectKeyFromObject(vmi))
	err := env.Client.Create(ctx, targetPod(vmi, vmim))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "the claims of networks blue (IPAMClaim vm1.blue) hold no IPs yet") {
		t.Fatalf("the target pod before the identity: %v, want 403 saying its claim holds no IPs", err)
	}
	if after := metricValue(t, "kvnet_launcher_target_pods_waiting_for_identity_total", nil); after != waiting+1 {
		t.Errorf("kvnet_launcher_target_pods_waiting_for_identity_total %v -> %v", waiting, after)
	}

	sent := it.identity(vmim, it.network, "10.100.0.5/24")
	if got := it.offer(t, it.fromA, sent); got != 0 {
		t.Fatalf("the bound peer's identity: refused %s", got)
	}
	claim, err := piGetClaim(it.ns, "vm1.blue")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(claim.Status.IPs, []string{"10.100.0.5/24"}) || claim.Annotations[persistentips.MACAnnotation] != "02:6b:76:00:00:05" {
		t.Fatalf("claim %s: status.ips %v, %s %q; want the source's IPs and MAC", claim.Name, claim.Status.IPs, persistentips.MACAnnotation, claim.Annotations[persistentips.MACAnnotation])
	}
	if ref := metav1.GetControllerOf(claim); ref == nil || ref.Kind != "VirtualMachine" || ref.Name != "vm1" {
		t.Errorf("claim %s is controlled by %+v, want VM vm1", claim.Name, ref)
	}
	identityEvent(t, vmim, corev1.EventTypeNormal, "NetworkIdentityReceived", "peer cluster-a")
	receivedMACHeld(t, other, "02:6b:76:00:00:05", it.ns, "vm1", "vm1.blue")
	// The same identity again (a retried offer) changes nothing.
	if got := it.offer(t, it.fromA, sent); got != 0 {
		t.Fatalf("the same identity again: refused %s", got)
	}
	if again, _ := piGetClaim(it.ns, "vm1.blue"); again.ResourceVersion != claim.ResourceVersion {
		t.Errorf("the same identity again wrote claim %s (resourceVersion %s -> %s)", claim.Name, claim.ResourceVersion, again.ResourceVersion)
	}

	// The target pod exists: an identity now would not reach it.
	pod := targetPod(vmi, vmim)
	mustCreate(t, env.Client, pod)
	elems := piSelection(t, piStoredPod(t, pod))
	if len(elems) != 1 || elems[0]["ipam-claim-reference"] != "vm1.blue" || elems[0]["mac"] != "02:6b:76:00:00:05" {
		t.Fatalf("the target pod's Multus elements %v, want blue's with claim vm1.blue and the source's MAC", elems)
	}
	it.refused(t, "an identity after the target pod", it.fromA, vmim, sent, hop.RefusedIdentityLate, persistentips.ReasonLate, "target pod")
	t.Logf("target side of the identity exchange: %s", time.Since(start).Round(time.Millisecond))
}

// A VM keeps its network identity across a cross-cluster live migration,
// through both proxies between two API servers, in the order KubeVirt
// writes the objects: the target's WaitAsReceiver VM, receiving VMI and
// receive VMIM; then the source VMIM, which kvnet's source proxy sees and
// offers the VM's claim IPs and MAC for; then the target pod, which
// virt-controller creates again until kvnet admits it. The target pod's
// claim holds the source's IPs and its Multus element the source's MAC.
func TestIdentityAcrossClusters(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	src, err := framework.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Stop)
	it := startIdentityTarget(t)
	vmi, vmim := it.receive(t, "vm1")

	// The source cluster: the running VM's VMI with the MAC the guest
	// has, and its claim as kvnet's controller created it and
	// OVN-Kubernetes filled it.
	mustCreate(t, src.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: it.ns}})
	srcVMI := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: it.ns, Name: "vm1"},
		Spec:       *vmi.Spec.DeepCopy(),
	}
	mustCreate(t, src.Client, srcVMI)
	srcVMI.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running, Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{
		{Name: "default", MAC: "02:6b:76:00:00:01"}, {Name: "blue", MAC: "02:6b:76:00:00:09", IP: "10.100.0.9"},
	}}
	if err := src.Client.Update(ctx, srcVMI); err != nil {
		t.Fatal(err)
	}
	claim := persistentips.NewClaim(persistentips.OwnerOf(srcVMI), "blue", it.network)
	mustCreate(t, src.Client, claim)
	claim.Status.IPs = []string{"10.100.0.9/24"}
	if err := src.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	startSourceProxy(t, src.Config, it, it.fromA.Cert, 7)
	offered := metricValue(t, "kvnet_proxy_identities_offered_total", map[string]string{"outcome": "accepted"})
	mustCreate(t, src.Client, &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: it.ns, Name: "vm1-out"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1",
			SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: vmim.Spec.Receive.MigrationID, ConnectURL: "127.0.0.1:9185"}},
	})

	// virt-controller's createTargetPod, retried while it is denied for
	// want of the identity.
	admitTargetPod(t, vmi, vmim)
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(it.ns), client.MatchingLabels{kubevirtv1.MigrationJobLabel: string(vmim.UID)}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("target pods: %d (%v), want 1", len(pods.Items), err)
	}
	elems := piSelection(t, &pods.Items[0])
	got, err := piGetClaim(it.ns, "vm1.blue")
	if err != nil {
		t.Fatal(err)
	}
	if len(elems) != 1 || elems[0]["ipam-claim-reference"] != "vm1.blue" || elems[0]["mac"] != "02:6b:76:00:00:09" || !slices.Equal(got.Status.IPs, claim.Status.IPs) {
		t.Fatalf("target pod elements %v and claim status.ips %v, want claim vm1.blue with the source's %v and MAC 02:6b:76:00:00:09", elems, got.Status.IPs, claim.Status.IPs)
	}
	// The source proxy counts the offer once the target's answer is back,
	// which may be after the target admitted the pod.
	piEventually(t, "the offer counted", func() error {
		if after := metricValue(t, "kvnet_proxy_identities_offered_total", map[string]string{"outcome": "accepted"}); after != offered+1 {
			return fmt.Errorf("kvnet_proxy_identities_offered_total{outcome=accepted} %v -> %v, want one offer", offered, after)
		}
		return nil
	})
	t.Logf("identity across two clusters: %s", time.Since(start).Round(time.Millisecond))
}

// receivedMACHeld shows that a MAC received in a cross-cluster migration
// is taken beside kubemacpool (issue 51): with kubemacpool v0.51.1 running
// and registered as it ships, a new VM in namespace ns asking for mac (on
// its pod interface) is refused by kvnet, naming the MAC, the VM that
// received it and its claim; kubemacpool, which never saw the MAC (it is
// on the claim and the launcher pod, not the VM), would have taken it. A
// VM asking for another MAC is created.
func receivedMACHeld(t *testing.T, ns, mac, holderNS, holder, claim string) {
	t.Helper()
	ctx := context.Background()
	k, err := framework.StartKubemacpool(ctx, env.Config, env.Client, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Stop()
	framework.Eventually(t, "kvnet's cache has kubemacpool's webhook and the received MAC", framework.CacheTimeout, func() error {
		var hooks admissionregv1.MutatingWebhookConfigurationList
		if err := env.Manager.GetCache().List(ctx, &hooks); err != nil {
			return err
		}
		slices.SortFunc(hooks.Items, func(a, b admissionregv1.MutatingWebhookConfiguration) int { return strings.Compare(a.Name, b.Name) })
		if p := peers.KubemacpoolFor(hooks.Items, ns, nil); p.Webhook == "" {
			return errors.New("kubemacpool's webhook is not cached yet")
		}
		var claims ipamv1alpha1.IPAMClaimList
		if err := env.Manager.GetCache().List(ctx, &claims, client.MatchingFields{lookup.ClaimMACIndexField: mac}); err != nil {
			return err
		}
		if len(claims.Items) == 0 {
			return fmt.Errorf("no cached claim holds %s yet", mac)
		}
		return nil
	})
	vm := func(name, mac string) *kubevirtv1.VirtualMachine {
		return &kubevirtv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: kubevirtv1.VirtualMachineSpec{RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted), Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: kubevirtv1.VirtualMachineInstanceSpec{
					Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
						Name: "default", MacAddress: mac, InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
					}}}},
					Networks: []kubevirtv1.Network{*kubevirtv1.DefaultPodNetwork()},
				},
			}},
		}
	}
	err = env.Client.Create(ctx, vm("twin", mac))
	want := fmt.Sprintf("MAC %s is held by VirtualMachine %s/%s, which received it in a cross-cluster migration (IPAMClaim %s)", mac, holderNS, holder, claim)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
		t.Fatalf("a VM asking for the received MAC %s: %v; want 422 saying %q", mac, err, want)
	}
	if err := env.Client.Create(ctx, vm("other-mac", "02:6b:76:00:00:66")); err != nil {
		t.Fatalf("a VM asking for a MAC nobody holds: %v", err)
	}
}
