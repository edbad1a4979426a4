package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/test/framework"
)

// stopIPAMExtensions uninstalls ipam-extensions and waits until kvnet's
// cache no longer has its webhook: kvnet leaves claim references to it
// while it sees it, which later tests must not inherit.
func stopIPAMExtensions(t *testing.T, ie *framework.IPAMExtensions) {
	t.Helper()
	ie.Stop()
	piEventually(t, "ipam-extensions' webhook gone from kvnet's cache", func() error {
		var list admissionregv1.MutatingWebhookConfigurationList
		if err := env.Manager.GetCache().List(context.Background(), &list); err != nil {
			return err
		}
		if name := peers.IPAMExtensionsIn(list.Items); name != "" {
			return fmt.Errorf("%s still cached", name)
		}
		return nil
	})
}

// deleteVM checks what was seen so far, then deletes vm's VMI and the VM
// (KubeVirt's finalizer dropped, as virt-controller would) and waits until
// no finalizer is left on its claims: the garbage collector, which envtest
// does not run, then deletes them by their owner reference.
func deleteVM(t *testing.T, cw *framework.ClaimWatch, vm *kubevirtv1.VirtualMachine, vmi *kubevirtv1.VirtualMachineInstance, claims ...string) {
	t.Helper()
	ctx := context.Background()
	cw.OwnersGoing(t)
	piDeleteAndWait(t, vmi)
	var cur kubevirtv1.VirtualMachine
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vm), &cur); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	piDropFinalizer(vm)
	for _, name := range claims {
		piEventually(t, "claim "+name+" freed", func() error {
			c, err := piGetClaim(vm.Namespace, name)
			if err != nil {
				return client.IgnoreNotFound(err)
			}
			if len(c.Finalizers) > 0 {
				return fmt.Errorf("finalizers %v", c.Finalizers)
			}
			return nil
		})
	}
}

// The move from ipam-extensions (issue 44): a VM whose two claims the real
// ipam-extensions created (spec.network only, spec.interface empty, its
// own finalizer), whose IPs the CNI wrote and whose launcher pod its
// webhook referenced, keeps those claims when kvnet takes over: same
// names, UIDs and status.ips, kvnet's finalizer added and, once
// ipam-extensions is gone, its finalizer removed (never before kvnet's is
// on), never deleted. ipam-extensions is stopped first (its webhook
// configuration and process gone, its finalizer left on the claims). The
// VM is stopped and started, then live-migrated, and each new launcher pod
// references the same claims. Deleting the VM afterwards frees them.
func TestClaimsOfIPAMExtensionsAdoptedInPlace(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	networks := map[string]string{"vm1.blue": "blue-" + ns, "vm1.green": "green-" + ns}
	piPersistentNAD(t, ns, "blue", networks["vm1.blue"])
	piPersistentNAD(t, ns, "green", networks["vm1.green"])
	// kvnet is not yet in charge of the namespace.
	restore, err := env.SetConfig(testConfig + "excludedNamespaces: [kube-system, " + ns + "]\n")
	if err != nil {
		t.Fatal(err)
	}
	ie, err := framework.StartIPAMExtensions(ctx, env.Config, env.Client, t.TempDir(), framework.IPAMExtensionsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stopIPAMExtensions(t, ie)
		}
	})
	cw := env.WatchClaims(t, ns)
	vm := piVmWithNetworks(ns, "vm1", [2]string{"blue", "blue"}, [2]string{"green", "green"})
	piCreateVM(t, vm)
	vmi := piStartVMI(t, vm)
	made := map[string]*ipamv1alpha1.IPAMClaim{}
	ips := map[string][]string{"vm1.blue": {"10.100.0.40/24"}, "vm1.green": {"10.100.0.41/24"}}
	for name := range ips {
		piEventually(t, "ipam-extensions creates claim "+name, func() error {
			c, err := piGetClaim(ns, name)
			if err != nil {
				return err
			}
			made[name] = c
			return nil
		})
		c := made[name]
		if c.Spec.Network != networks[name] || c.Spec.Interface != "" || !controllerutil.ContainsFinalizer(c, framework.IPAMExtensionsFinalizer) {
			t.Fatalf("ipam-extensions' claim %s: spec %+v, finalizers %v; want network %s, no interface and its finalizer", name, c.Spec, c.Finalizers, networks[name])
		}
		// The CNI (OVN-Kubernetes) writes the IP it allocated.
		c.Status.IPs = ips[name]
		if err := env.Client.Status().Update(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// ipam-extensions' webhook references its claims on the VM's pod.
	running := piStoredPod(t, piCreateLauncher(t, vmi))
	if refs := piClaimRefs(t, running); refs["blue"] != "vm1.blue" || refs["green"] != "vm1.green" {
		t.Fatalf("the launcher pod under ipam-extensions references %v", refs)
	}

	const tookOver = "took over an IPAMClaim from ipam-extensions, which is no longer installed: removed its finalizer, kvnet's holds the claim"
	logged := map[string]int{}
	for name := range made {
		logged[name] = env.Logs.Count(tookOver, "claim", name)
	}

	// The move: ipam-extensions uninstalled, kvnet in charge. The VM is
	// stopped and started, then live-migrated: each new launcher pod
	// references the same claims, and kvnet takes the claims over.
	stopIPAMExtensions(t, ie)
	stopped = true
	restore()
	piDeleteAndWait(t, running)
	piDeleteAndWait(t, vmi)
	vmi = piStartVMI(t, vm)
	started := piStoredPod(t, piCreateLauncher(t, vmi))
	local := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1-drain"},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"}}
	mustCreate(t, env.Client, local)
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstance{}, client.ObjectKeyFromObject(vmi))
	target := targetPod(vmi, local)
	mustCreate(t, env.Client, target)
	for what, pod := range map[string]*corev1.Pod{"after a stop and start": started, "of a live migration": piStoredPod(t, target)} {
		if refs := piClaimRefs(t, pod); refs["blue"] != "vm1.blue" || refs["green"] != "vm1.green" {
			t.Fatalf("the launcher pod %s references %v, want the claims ipam-extensions made", what, refs)
		}
	}
	for name, want := range made {
		piEventually(t, "kvnet adopts claim "+name, func() error {
			cw.Check(t)
			c, err := piGetClaim(ns, name)
			if err != nil {
				return err
			}
			if c.UID != want.UID || !slices.Equal(c.Status.IPs, ips[name]) {
				t.Fatalf("claim %s is UID %s with status.ips %v, want ipam-extensions' %s with %v", name, c.UID, c.Status.IPs, want.UID, ips[name])
			}
			if !slices.Equal(c.Finalizers, []string{persistentips.Finalizer}) {
				return fmt.Errorf("finalizers %v, want kvnet's alone once ipam-extensions is gone", c.Finalizers)
			}
			return nil
		})
		if n := env.Logs.Count(tookOver, "claim", name) - logged[name]; n != 1 {
			t.Errorf("%d log lines say claim %s was taken over, want 1", n, name)
		}
	}

	// Deleting the VM frees its claim: no finalizer is left on it (the
	// garbage collector, which envtest does not run, then deletes it by
	// its owner reference).
	piDeleteAndWait(t, target)
	piDeleteAndWait(t, started)
	deleteVM(t, cw, vm, vmi, "vm1.blue", "vm1.green")
}

// Beside ipam-extensions (issue 44), in both webhook orders (the API
// server calls configurations in name order: ipam-extensions' own name
// sorts before "kvnet", "zz-..." after): a VM with two persistent-IP
// networks gets each claim exactly once, with the VM as its one
// controller, and its launcher pod one ipam-claim-reference per network,
// which kvnet leaves to ipam-extensions and says so in kvnet.io/mutations,
// kvnet_launcher_claim_refs_left_to_peer_total and one log line. Stop,
// start and deletion finish, with no finalizer left on the claims.
//
// docs/peers.md's ipam-extensions table is what this test saw.
func TestBesideIPAMExtensions(t *testing.T) {
	var rows []string
	for _, order := range []struct{ name, configuration string }{
		{"ipam-extensions, then kvnet", framework.IPAMExtensionsConfiguration},
		{"kvnet, then ipam-extensions", "zz-" + framework.IPAMExtensionsConfiguration},
	} {
		t.Run(strings.ReplaceAll(order.name, ",", ""), func(t *testing.T) {
			ctx := context.Background()
			ns := env.NewNamespace(t, nil)
			piPersistentNAD(t, ns, "blue", "blue-"+ns)
			piPersistentNAD(t, ns, "green", "green-"+ns)
			ie, err := framework.StartIPAMExtensions(ctx, env.Config, env.Client, t.TempDir(), framework.IPAMExtensionsOptions{ConfigurationName: order.configuration})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { stopIPAMExtensions(t, ie) })
			piEventually(t, "kvnet's cache sees ipam-extensions' webhook", func() error {
				var list admissionregv1.MutatingWebhookConfigurationList
				if err := env.Manager.GetCache().List(ctx, &list); err != nil {
					return err
				}
				for _, c := range list.Items {
					if c.Name == order.configuration {
						return nil
					}
				}
				return fmt.Errorf("not yet")
			})
			cw := env.WatchClaims(t, ns)
			left := metricValue(t, "kvnet_launcher_claim_refs_left_to_peer_total", map[string]string{"peer": "ipam-extensions"})
			vm := piVmWithNetworks(ns, "vm1", [2]string{"blue", "blue"}, [2]string{"green", "green"})
			piCreateVM(t, vm)
			vmi := piStartVMI(t, vm)
			for _, name := range []string{"vm1.blue", "vm1.green"} {
				piEventually(t, "claim "+name, func() error {
					c, err := piGetClaim(ns, name)
					if err != nil {
						return err
					}
					if n := len(c.OwnerReferences); n != 1 || c.OwnerReferences[0].UID != vm.UID || !ptr.Deref(c.OwnerReferences[0].Controller, false) {
						t.Fatalf("claim %s has owners %+v, want the VM alone as controller", name, c.OwnerReferences)
					}
					return nil
				})
			}
			var claims ipamv1alpha1.IPAMClaimList
			if err := env.Client.List(ctx, &claims, client.InNamespace(ns)); err != nil || len(claims.Items) != 2 {
				t.Fatalf("%d claims in the namespace (%v), want 2", len(claims.Items), err)
			}
			owners := "the VM alone"
			for _, c := range claims.Items {
				if len(c.OwnerReferences) != 1 {
					owners = fmt.Sprintf("%d owners", len(c.OwnerReferences))
				}
			}
			var refCounts []string
			who := "ipam-extensions; kvnet left them to it"
			for run := range 2 { // a start, then a stop and start
				pod := piStoredPod(t, piCreateLauncher(t, vmi))
				elems := piSelection(t, pod)
				refs := 0
				for _, e := range elems {
					if _, ok := e["ipam-claim-reference"]; ok {
						refs++
					}
				}
				if r := piClaimRefs(t, pod); refs != 2 || r["blue"] != "vm1.blue" || r["green"] != "vm1.green" {
					t.Fatalf("run %d: launcher pod elements %v, want one reference per network", run, elems)
				}
				refCounts = append(refCounts, fmt.Sprint(refs))
				if m := pod.Annotations[chain.MutationsAnnotation]; !strings.Contains(m, `"leftTo":"ipam-extensions"`) {
					who = "kvnet"
					t.Errorf("run %d: kvnet.io/mutations %s does not say the references were left to ipam-extensions", run, m)
				}
				piDeleteAndWait(t, pod)
				if run == 0 {
					piDeleteAndWait(t, vmi)
					vmi = piStartVMI(t, vm)
				}
			}
			if d := metricValue(t, "kvnet_launcher_claim_refs_left_to_peer_total", map[string]string{"peer": "ipam-extensions"}) - left; d != 4 {
				t.Errorf("kvnet_launcher_claim_refs_left_to_peer_total{peer=ipam-extensions} rose by %v, want 4 (two networks, two pods)", d)
			}
			deleteVM(t, cw, vm, vmi, "vm1.blue", "vm1.green")
			rows = append(rows, fmt.Sprintf("| %s | %d, controlled by %s | %s | %s | no finalizer left |",
				order.name, len(claims.Items), owners, strings.Join(refCounts, " / "), who))
		})
	}
	framework.CheckDocTable(t, "ipam-extensions", []string{"order", "claims (want 2)", "references per launcher pod (want 2: one per network)", "who referenced them", "after the VM is deleted"}, rows)
}
