package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/test/framework"
)

// srcNet is one network of a source VM: the VM's network name, the
// network its claim is on, the claim's IPs and the interface's MAC.
type srcNet struct {
	name, network, mac string
	ips                []string
}

// vmWith creates a running VMI ns/name in the source cluster with a
// secondary network per net and, for each, its claim as kvnet's controller
// created it and OVN-Kubernetes filled it.
func (s *sourceCluster) vmWith(t *testing.T, ns, name string, nets ...srcNet) {
	t.Helper()
	ctx := context.Background()
	var pairs [][2]string
	for _, n := range nets {
		pairs = append(pairs, [2]string{n.name, n.name})
	}
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       *piVmWithNetworks(ns, name, pairs...).Spec.Template.Spec.DeepCopy(),
	}
	mustCreate(t, s.Client, vmi)
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running}
	for _, n := range nets {
		vmi.Status.Interfaces = append(vmi.Status.Interfaces, kubevirtv1.VirtualMachineInstanceNetworkInterface{Name: n.name, MAC: n.mac})
	}
	if err := s.Client.Update(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	for _, n := range nets {
		claim := persistentips.NewClaim(persistentips.OwnerOf(vmi), n.name, n.network)
		mustCreate(t, s.Client, claim)
		claim.Status.IPs = n.ips
		if err := s.Client.Status().Update(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
}

// Every refusal of a network identity, through both proxies between two
// API servers (issue 43): the source proxy offers what the sending VMIM's
// VM holds; the target proxy refuses it. For each, the source counts the
// refusal in kvnet_proxy_identities_offered_total{outcome} and logs it,
// the receive VMIM gets an event (when the receiver, not the hop,
// refused), and the target pod's denial says why. Then a VM with two
// networks, one of them dual-stack, moves with all its addresses and MACs.
func TestIdentityRefusalsThroughBothProxies(t *testing.T) {
	ctx := context.Background()
	it := startIdentityTarget(t)
	ns := it.ns
	green := "green-" + ns
	env.CreateNAD(t, ns, "green", "", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"%s","type":"ovn-k8s-cni-overlay","topology":"layer2","subnets":"10.101.0.0/24,fd00:101::/64","netAttachDefName":"%s","allowPersistentIPs":true}`, green, ns+"/green"))
	c, err := framework.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	src := &sourceCluster{Cluster: c, network: it.network}
	mustCreate(t, src.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	startSourceProxy(t, src.Config, it, it.fromA.Cert, 8)

	// What holds addresses and MACs in the target: a claim and a pod of
	// another namespace on blue's network, a VMI there with a MAC.
	other := env.NewNamespace(t, nil)
	piPersistentNAD(t, other, "blue", it.network)
	heldClaim(t, other, it.network, "10.100.0.7/24")
	mustCreate(t, env.Client, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "web", Annotations: map[string]string{
			multus.NetworksAnnotation:      other + "/blue",
			multus.NetworkStatusAnnotation: `[{"name":"` + other + `/blue","interface":"net1","ips":["10.100.0.8"]}]`,
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	})
	macVMI := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "guest"},
		Spec: *piVmWithNetworks(other, "guest", [2]string{"blue", "blue"}).Spec.Template.Spec.DeepCopy()}
	mustCreate(t, env.Client, macVMI)
	macVMI.Status.Interfaces = []kubevirtv1.VirtualMachineInstanceNetworkInterface{{Name: "blue", MAC: "02:6b:76:02:00:99"}}
	if err := env.Client.Update(ctx, macVMI); err != nil {
		t.Fatal(err)
	}

	blue := func(mac string, ips ...string) srcNet {
		return srcNet{name: "blue", network: it.network, mac: mac, ips: ips}
	}
	type refusalCase struct {
		name    string
		source  []srcNet
		target  [][2]string       // the receiving VM's networks; nil: blue only
		annot   map[string]string // on the sending VMIM
		srcName string            // the sending VM, when not name
		late    bool              // the target pod exists first
		outcome hop.RefusalCode   // what the source hears
		reason  string            // the receiver's reason; "" when the hop refused
		says    string            // in the event and the pod's denial
	}
	cases := []refusalCase{
		{name: "network-name", source: []srcNet{{name: "blue", network: "red-" + ns, mac: "02:6b:76:02:00:01", ips: []string{"10.100.0.21/24"}}},
			outcome: hop.RefusedIdentityMismatch, reason: persistentips.ReasonNetworkName, says: `networks[blue].networkName: "red-` + ns + `"`},
		{name: "outside-subnet", source: []srcNet{blue("02:6b:76:02:00:02", "10.100.1.22/24")},
			outcome: hop.RefusedIdentityMismatch, reason: persistentips.ReasonOutsideSubnets, says: "10.100.1.22/24 is in no subnet"},
		{name: "claim-holds-ip", source: []srcNet{blue("02:6b:76:02:00:03", "10.100.0.7/24")},
			outcome: hop.RefusedIdentityHeld, reason: persistentips.ReasonHeld, says: "10.100.0.7 is already held on network \"" + it.network + "\" by an IPAMClaim in another namespace"},
		{name: "pod-holds-ip", source: []srcNet{blue("02:6b:76:02:00:04", "10.100.0.8/24")},
			outcome: hop.RefusedIdentityHeld, reason: persistentips.ReasonHeld, says: "10.100.0.8 is already held on network \"" + it.network + "\" by a pod in another namespace"},
		{name: "mac-held", source: []srcNet{blue("02:6b:76:02:00:99", "10.100.0.25/24")},
			outcome: hop.RefusedIdentityHeld, reason: persistentips.ReasonHeld, says: "networks[blue].mac: 02:6b:76:02:00:99 is already used by a VirtualMachineInstance in another namespace"},
		{name: "network-missing", source: []srcNet{blue("02:6b:76:02:00:06", "10.100.0.26/24")}, target: [][2]string{{"blue", "blue"}, {"green", "green"}},
			outcome: hop.RefusedIdentityMismatch, reason: persistentips.ReasonNetworkName, says: `the receiving VM's network "green"`},
		{name: "network-extra", source: []srcNet{blue("02:6b:76:02:00:07", "10.100.0.27/24"), {name: "green", network: green, mac: "02:6b:76:02:01:07", ips: []string{"10.101.0.27/24"}}},
			outcome: hop.RefusedIdentityMismatch, reason: persistentips.ReasonNetworkName, says: `networks[green].name: the receiving VM has no secondary network "green"`},
		{name: "late", source: []srcNet{blue("02:6b:76:02:00:08", "10.100.0.28/24")}, late: true,
			outcome: hop.RefusedIdentityLate, reason: persistentips.ReasonLate, says: "target pod"},
		{name: "wrong-vm", srcName: "intruder", source: []srcNet{blue("02:6b:76:02:00:09", "10.100.0.29/24")},
			annot: map[string]string{proxy.AnnotationMigrationTarget: ns + "/wrong-vm"}, outcome: hop.RefusedWrongVM},
	}
	refusedLogs := func(reason hop.RefusalCode) int {
		return env.Logs.Count("the peer refused the migration's network identity; its target pod will not be admitted", "reason", reason.String()) +
			env.Logs.Count("the peer refused the migration's network identity for now; offering again", "reason", reason.String())
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srcName := c.name
			if c.srcName != "" {
				srcName = c.srcName
			}
			src.vmWith(t, ns, srcName, c.source...)
			nets := c.target
			if nets == nil {
				nets = [][2]string{{"blue", "blue"}}
			}
			vm := piVmWithNetworks(ns, c.name, nets...)
			vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyWaitAsReceiver)
			piCreateVM(t, vm)
			vmi := piStartVMI(t, vm)
			vmim := &kubevirtv1.VirtualMachineInstanceMigration{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.name + "-in"},
				Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: c.name,
					Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: ns + "-" + c.name}},
			}
			mustCreate(t, env.Client, vmim)
			env.WaitCached(t, &kubevirtv1.VirtualMachineInstanceMigration{}, client.ObjectKeyFromObject(vmim))
			if c.late {
				// Admitted while kvnet did not act on it (as with the
				// webhook down and failurePolicy Ignore).
				pod := targetPod(vmi, vmim)
				pod.Annotations[chain.SkipAnnotation] = "true"
				mustCreate(t, env.Client, pod)
			}
			before, logs := metricValue(t, "kvnet_proxy_identities_offered_total", map[string]string{"outcome": c.outcome.String()}), refusedLogs(c.outcome)
			send(t, src.Client, ns, srcName, vmim.Spec.Receive.MigrationID, c.annot)
			piEventually(t, "the source counts and logs "+c.outcome.String(), func() error {
				if d := metricValue(t, "kvnet_proxy_identities_offered_total", map[string]string{"outcome": c.outcome.String()}) - before; d < 1 {
					return fmt.Errorf("kvnet_proxy_identities_offered_total{outcome=%s} rose by %v", c.outcome, d)
				}
				if refusedLogs(c.outcome) <= logs {
					return fmt.Errorf("no log line of the refusal")
				}
				return nil
			})
			if c.reason == "" {
				if evs := identityEvents(t, ns); slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, vmim.Name+":") }) {
					t.Errorf("the hop's refusal wrote events on %s: %q", vmim.Name, evs)
				}
			} else {
				identityEvent(t, vmim, corev1.EventTypeWarning, "NetworkIdentityRefused", c.says)
			}
			if c.late {
				return
			}
			env.WaitCached(t, &kubevirtv1.VirtualMachineInstance{}, client.ObjectKeyFromObject(vmi))
			want := "hold no IPs yet"
			if c.reason != "" {
				want = "the source cluster's network identity was refused: " + c.reason + ": "
			}
			piEventually(t, "the target pod's denial says "+want, func() error {
				err := env.Client.Create(ctx, targetPod(vmi, vmim))
				switch {
				case err == nil:
					t.Fatal("the target pod was admitted without its identity")
				case !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "hold no IPs yet"):
					t.Fatalf("the target pod: %v, want 403 while its claims hold no IPs", err)
				case !strings.Contains(err.Error(), want):
					return err
				}
				return nil
			})
		})
	}

	// The happy path: two networks, green dual-stack, each with its MAC.
	src.vmWith(t, ns, "mover", blue("02:6b:76:02:00:10", "10.100.0.30/24"),
		srcNet{name: "green", network: green, mac: "02:6b:76:02:01:10", ips: []string{"10.101.0.30/24", "fd00:101::30/64"}})
	vm := piVmWithNetworks(ns, "mover", [2]string{"blue", "blue"}, [2]string{"green", "green"})
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyWaitAsReceiver)
	piCreateVM(t, vm)
	vmi := piStartVMI(t, vm)
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mover-in"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "mover",
			Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: ns + "-mover"}},
	}
	mustCreate(t, env.Client, vmim)
	send(t, src.Client, ns, "mover", vmim.Spec.Receive.MigrationID, nil)
	pod := piStoredPod(t, admitTargetPod(t, vmi, vmim))
	macs := map[string]string{}
	for _, e := range piSelection(t, pod) {
		macs[fmt.Sprint(e["ipam-claim-reference"])], _ = e["mac"].(string)
	}
	for claim, want := range map[string]struct {
		ips []string
		mac string
	}{
		"mover.blue":  {[]string{"10.100.0.30/24"}, "02:6b:76:02:00:10"},
		"mover.green": {[]string{"10.101.0.30/24", "fd00:101::30/64"}, "02:6b:76:02:01:10"},
	} {
		got, err := piGetClaim(ns, claim)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Status.IPs, want.ips) || macs[claim] != want.mac {
			t.Errorf("%s: status.ips %v and element MAC %q, want %v and %s", claim, got.Status.IPs, macs[claim], want.ips, want.mac)
		}
	}
	identityEvent(t, vmim, corev1.EventTypeNormal, "NetworkIdentityReceived", "2 networks")

	// A third proxy (cluster-c), trusted by the target but not the one
	// the migration is bound to, offers the same VM's identity again.
	before := metricValue(t, "kvnet_proxy_identities_offered_total", map[string]string{"outcome": hop.RefusedOtherPeer.String()})
	logs := refusedLogs(hop.RefusedOtherPeer)
	startSourceProxy(t, src.Config, it, it.fromC.Cert, 9)
	piEventually(t, "the unbound third proxy's offer refused as another peer's", func() error {
		if d := metricValue(t, "kvnet_proxy_identities_offered_total", map[string]string{"outcome": hop.RefusedOtherPeer.String()}) - before; d < 1 {
			return fmt.Errorf("kvnet_proxy_identities_offered_total{outcome=%s} rose by %v", hop.RefusedOtherPeer, d)
		}
		if refusedLogs(hop.RefusedOtherPeer) <= logs {
			return fmt.Errorf("no log line of the refusal")
		}
		return nil
	})
	if got, _ := piGetClaim(ns, "mover.blue"); !slices.Equal(got.Status.IPs, []string{"10.100.0.30/24"}) {
		t.Errorf("mover.blue after the third proxy: %v", got.Status.IPs)
	}
}
