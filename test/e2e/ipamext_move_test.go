package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/test/framework"
)

// The move from ipam-extensions to kvnet (issue 44), under KubeVirt's own
// virt-controller and virt-api. Two VMs run under ipam-extensions alone
// (kvnet excludes their namespaces): one with two persistent-IP secondary
// networks, one on a primary layer2 UDN. ipam-extensions creates their
// claims (spec.network only, its finalizer) and references them; the test
// writes each claim's status.ips as the CNI would. ipam-extensions is then
// uninstalled (webhook configuration and process gone, its finalizer left
// on the claims) and kvnet takes the namespaces. Each VM is stopped and
// started by its runStrategy, and the secondary one is live-migrated:
// every new launcher pod references the same claims, now through kvnet.
// kvnet adopts each claim in place: same UID and status.ips, its
// finalizer alone once ipam-extensions' is removed. A watch on the claims
// for the whole run fails the test on any deletion or any change of UID
// or status.ips. Deleting the VMs afterwards frees their claims.
func TestMoveFromIPAMExtensionsUnderKubeVirt(t *testing.T) {
	ctx := context.Background()
	udnEnable(t)
	secondary, udn := env.NewNamespace(t, nil), env.NewNamespace(t, nil)
	restore, err := env.SetConfig(testConfig + "persistentIPs: {primaryUDN: {enabled: true}}\n" +
		"excludedNamespaces: [kube-system, " + secondary + ", " + udn + "]\n")
	if err != nil {
		t.Fatal(err)
	}
	restored := false
	t.Cleanup(func() {
		if !restored {
			restore()
		}
	})
	ie := startIPAMExt(t, framework.IPAMExtensionsConfiguration)
	watches := map[string]*framework.ClaimWatch{secondary: env.WatchClaims(t, secondary), udn: env.WatchClaims(t, udn)}
	vms := createIPAMExtVMs(t, secondary, udn)
	ips := map[string][]string{"db.blue": {"10.100.0.40/24"}, "db.green": {"10.100.0.41/24"}, "web.default": {"10.220.0.9/16"}}

	// Under ipam-extensions alone: its claims, the IPs the CNI wrote, its
	// references on the pods virt-controller renders.
	made := map[string]types.UID{}
	for _, vm := range vms {
		for _, name := range vm.claims {
			var c ipamv1alpha1.IPAMClaim
			framework.Eventually(t, "ipam-extensions creates claim "+name, waitTimeout, func() error {
				return env.Client.Get(ctx, client.ObjectKey{Namespace: vm.ns, Name: name}, &c)
			})
			if c.Spec.Interface != "" || !slices.Equal(c.Finalizers, []string{framework.IPAMExtensionsFinalizer}) {
				t.Fatalf("ipam-extensions' claim %s: spec %+v, finalizers %v; want no interface and its finalizer alone", name, c.Spec, c.Finalizers)
			}
			c.Status.IPs = ips[name]
			if err := env.Client.Status().Update(ctx, &c); err != nil {
				t.Fatal(err)
			}
			made[name] = c.UID
		}
		checkClaimRefs(t, 0, vm, waitLauncherPod(t, waitVMI(t, vm.ns, vm.name)))
	}

	// The move.
	ie.Stop()
	waitPeerCached(t, framework.IPAMExtensionsConfiguration, false)
	restore()
	restored = true

	for _, vm := range vms {
		old := waitVMI(t, vm.ns, vm.name)
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyHalted)
		waitGone(t, old)
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyAlways)
		vmi := waitVMI(t, vm.ns, vm.name)
		pod := waitLauncherPod(t, vmi)
		checkClaimRefs(t, 1, vm, pod)
		if vm.name != "db" {
			continue
		}
		src, _ := nodeNames(t)
		runVMI(t, vmi, pod, src)
		vmim := &kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: vm.ns, Name: "db-move"},
			Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vm.name},
		}
		if err := env.Client.Create(ctx, vmim); err != nil {
			t.Fatalf("creating the migration: %v", err)
		}
		var target corev1.Pod
		framework.Eventually(t, "virt-controller creates the migration target pod", waitTimeout, func() error {
			var pods corev1.PodList
			if err := env.Client.List(ctx, &pods, client.InNamespace(vm.ns), client.MatchingLabels{kubevirtv1.MigrationJobLabel: string(vmim.UID)}); err != nil || len(pods.Items) == 0 {
				return fmt.Errorf("%d pods, %v", len(pods.Items), err)
			}
			target = pods.Items[0]
			return nil
		})
		checkClaimRefs(t, 2, vm, &target)
	}

	for _, vm := range vms {
		for _, name := range vm.claims {
			framework.Eventually(t, "kvnet adopts claim "+name+" in place", waitTimeout, func() error {
				watches[vm.ns].Check(t)
				var c ipamv1alpha1.IPAMClaim
				if err := env.Client.Get(ctx, client.ObjectKey{Namespace: vm.ns, Name: name}, &c); err != nil {
					return err
				}
				if c.UID != made[name] || !slices.Equal(c.Status.IPs, ips[name]) {
					t.Fatalf("claim %s is UID %s with status.ips %v, want ipam-extensions' %s with %v", name, c.UID, c.Status.IPs, made[name], ips[name])
				}
				if !slices.Equal(c.Finalizers, []string{persistentips.Finalizer}) {
					return fmt.Errorf("finalizers %v, want kvnet's alone once ipam-extensions is gone", c.Finalizers)
				}
				return nil
			})
		}
	}
	for _, vm := range vms {
		watches[vm.ns].OwnersGoing(t)
		if vm.name == "db" {
			endMigratedVM(t, vm)
		}
		deleteVMAndWaitClaimsFree(t, vm)
	}
}

// endMigratedVM plays what the missing kubelet and virt-handler would do
// for a VM whose launcher pods were bound to a node: the pods are gone
// (deleted with no grace period: no kubelet confirms a deletion here).
func endMigratedVM(t *testing.T, vm ipamExtVM) {
	t.Helper()
	ctx := context.Background()
	var vmi kubevirtv1.VirtualMachineInstance
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: vm.ns, Name: vm.name}, &vmi); err != nil {
		t.Fatal(err)
	}
	pods, err := launcherPods(ctx, &vmi)
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		if err := env.Client.Delete(ctx, &pods[i], client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
}

// handOverFinalizer is the JSON patch docs/persistent-ips.md ("Moving back
// to ipam-extensions") gives an operator for each claim once kvnet is
// uninstalled: kvnet's finalizer, alone on the claim, becomes
// ipam-extensions' one, which its controller removes when the VM goes.
const handOverFinalizer = `[{"op":"test","path":"/metadata/finalizers","value":["` + persistentips.Finalizer + `"]},` +
	`{"op":"replace","path":"/metadata/finalizers","value":["` + framework.IPAMExtensionsFinalizer + `"]}]`

// The reverse move, from kvnet to ipam-extensions (issue 44), under
// KubeVirt's own virt-controller and virt-api, as docs/persistent-ips.md
// writes it. Two VMs run under kvnet (one with two secondary networks, one
// on a primary UDN), their claims' status.ips written as the CNI would.
// kvnet leaves (it excludes their namespaces: what it does not serve, it
// neither mutates nor reconciles), the operator hands each claim's
// finalizer over to ipam-extensions, and ipam-extensions is installed.
// Each VM is stopped and started: ipam-extensions takes kvnet's claims as
// the VM's (it checks only that the VM is their one owner) and its
// webhook references them on the new launcher pods. No claim is deleted
// or changes UID or status.ips; deleting the VMs frees them.
func TestMoveToIPAMExtensionsUnderKubeVirt(t *testing.T) {
	ctx := context.Background()
	doc, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "docs", "persistent-ips.md"))
	if err != nil {
		t.Fatal(err)
	}
	var ops []map[string]any
	if err := json.Unmarshal([]byte(handOverFinalizer), &ops); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops {
		b, _ := json.Marshal(op)
		if !strings.Contains(string(doc), string(b)) {
			t.Fatalf("docs/persistent-ips.md does not give the operation %s this test applies", b)
		}
	}
	udnEnable(t)
	secondary, udn := env.NewNamespace(t, nil), env.NewNamespace(t, nil)
	watches := map[string]*framework.ClaimWatch{secondary: env.WatchClaims(t, secondary), udn: env.WatchClaims(t, udn)}
	vms := createIPAMExtVMs(t, secondary, udn)
	ips := map[string][]string{"db.blue": {"10.100.0.50/24"}, "db.green": {"10.100.0.51/24"}, "web.default": {"10.220.0.9/16"}}

	// Under kvnet: its claims, the IPs the CNI wrote, its references.
	made := map[string]types.UID{}
	for _, vm := range vms {
		checkClaimRefs(t, 0, vm, waitLauncherPod(t, waitVMI(t, vm.ns, vm.name)))
		for _, name := range vm.claims {
			c := waitClaim(t, vm.ns, name)
			framework.Eventually(t, "kvnet's finalizer on claim "+name, waitTimeout, func() error {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(c), c); err != nil {
					return err
				}
				if !slices.Equal(c.Finalizers, []string{persistentips.Finalizer}) {
					return fmt.Errorf("finalizers %v", c.Finalizers)
				}
				return nil
			})
			c.Status.IPs = ips[name]
			if err := env.Client.Status().Update(ctx, c); err != nil {
				t.Fatal(err)
			}
			made[name] = c.UID
		}
	}

	// The move: kvnet leaves, the operator hands the finalizers over,
	// ipam-extensions comes.
	restore, err := env.SetConfig(testConfig + "persistentIPs: {primaryUDN: {enabled: true}}\n" +
		"excludedNamespaces: [kube-system, " + secondary + ", " + udn + "]\n")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restore)
	for _, vm := range vms {
		for _, name := range vm.claims {
			c := &ipamv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: vm.ns, Name: name}}
			if err := env.Client.Patch(ctx, c, client.RawPatch(types.JSONPatchType, []byte(handOverFinalizer))); err != nil {
				t.Fatalf("handing claim %s over to ipam-extensions: %v", name, err)
			}
		}
	}
	startIPAMExt(t, framework.IPAMExtensionsConfiguration)
	for _, vm := range vms {
		old := waitVMI(t, vm.ns, vm.name)
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyHalted)
		waitGone(t, old)
		setRunStrategy(t, vm.ns, vm.name, kubevirtv1.RunStrategyAlways)
		pod := waitLauncherPod(t, waitVMI(t, vm.ns, vm.name))
		checkClaimRefs(t, 1, vm, pod)
		if m := pod.Annotations[chain.MutationsAnnotation]; m != "" {
			t.Errorf("launcher pod of %s after kvnet left: kvnet.io/mutations %s, want none", vm.name, m)
		}
		for _, name := range vm.claims {
			var c ipamv1alpha1.IPAMClaim
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: vm.ns, Name: name}, &c); err != nil {
				t.Fatal(err)
			}
			if c.UID != made[name] || !slices.Equal(c.Status.IPs, ips[name]) || !slices.Equal(c.Finalizers, []string{framework.IPAMExtensionsFinalizer}) {
				t.Errorf("claim %s: UID %s, status.ips %v, finalizers %v; want kvnet's %s with %v, ipam-extensions' finalizer alone", name, c.UID, c.Status.IPs, c.Finalizers, made[name], ips[name])
			}
		}
	}
	for _, vm := range vms {
		watches[vm.ns].OwnersGoing(t)
		deleteVMAndWaitClaimsFree(t, vm)
	}
}
