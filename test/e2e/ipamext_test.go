package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/test/framework"
)

// ipamExtVM is one VM of TestBesideIPAMExtensionsUnderKubeVirt and what
// its launcher pod must carry.
type ipamExtVM struct {
	doc      string // what it is, for docs/peers.md
	ns, name string
	claims   []string          // the IPAMClaims it must have, once each
	refs     map[string]string // NAD -> ipam-claim-reference in k8s.v1.cni.cncf.io/networks
	primary  string            // the claim the default-network element references, if on a primary UDN
	// leftBy is the mutator that leaves the references to ipam-extensions,
	// for left (the VM's network names).
	leftBy string
	left   []string
}

// claimRefsLeftMetric counts the claim references kvnet left to a peer.
const claimRefsLeftMetric = "kvnet_launcher_claim_refs_left_to_peer_total"

// leftToIPAMExtensions is kvnet's log line when it leaves a pod's claim
// references to ipam-extensions.
const leftToIPAMExtensions = "leaving the pod's IPAMClaim references to ipam-extensions, which is registered for it"

// kubevirt/ipam-extensions (edb24de) run as its config/ deploys it, beside
// kvnet and KubeVirt's own virt-controller and virt-api, in both webhook
// orders (the API server calls configurations in name order: its own name
// sorts before "kvnet", "zz-..." after). Two VMs created through the API
// server, one with two persistent-IP secondary networks and one on a
// primary layer2 UDN asking for an IP and a MAC, are started by
// virt-controller; each gets each IPAMClaim exactly once with the VM as
// its one controller; each launcher pod virt-controller renders carries
// one ipam-claim-reference per network and, on the primary UDN, the
// default-network element once (ipam-extensions denies a launcher pod
// created with one, so kvnet must not write it first). kvnet says in
// kvnet.io/mutations, in kvnet_launcher_claim_refs_left_to_peer_total and
// in one log line per pod that it left them to ipam-extensions. Stopping,
// starting and deleting each VM finish, and no finalizer is left on its
// claims.
//
// docs/peers.md's ipam-extensions-kubevirt table is what this test saw
// (KVNET_UPDATE_DOCS=1 rewrites it).
func TestBesideIPAMExtensionsUnderKubeVirt(t *testing.T) {
	udnEnable(t)
	var rows []string
	for _, order := range []struct{ name, doc, configuration string }{
		{"ipam-extensions-first", "ipam-extensions, then kvnet", framework.IPAMExtensionsConfiguration},
		{"kvnet-first", "kvnet, then ipam-extensions", "zz-" + framework.IPAMExtensionsConfiguration},
	} {
		t.Run(order.name, func(t *testing.T) {
			startIPAMExt(t, order.configuration)
			waitPeerCached(t, order.configuration, true)
			left := leftToPeer(t, claimRefsLeftMetric, peers.IPAMExtensions)
			for _, want := range createIPAMExtVMs(t, env.NewNamespace(t, nil), env.NewNamespace(t, nil)) {
				var carries, who []string
				for run := range 2 { // a start, then a stop and start
					vmi := waitVMI(t, want.ns, want.name)
					pod := waitLauncherPod(t, vmi)
					c, w := checkIPAMExtLauncherPod(t, run, want, pod)
					carries, who = append(carries, c), append(who, w)
					checkClaimsOnce(t, want)
					if run == 0 {
						setRunStrategy(t, want.ns, want.name, kubevirtv1.RunStrategyHalted)
						waitGone(t, vmi)
						setRunStrategy(t, want.ns, want.name, kubevirtv1.RunStrategyAlways)
					}
				}
				if n := env.Logs.Count(leftToIPAMExtensions, "namespace", want.ns, "mutator", want.leftBy); n != 2 {
					t.Errorf("%d log lines say kvnet left %s's references to ipam-extensions, want 2 (one per launcher pod)", n, want.name)
				}
				deleteVMAndWaitClaimsFree(t, want)
				rows = append(rows, fmt.Sprintf("| %s | %s | %d, controlled by the VM alone | %s | %s | gone, no finalizer left on its claims |",
					order.doc, want.doc, len(want.claims), strings.Join(slices.Compact(carries), " / "), strings.Join(slices.Compact(who), " / ")))
			}
			// Two launcher pods each: two references of db, one of web.
			if d := leftToPeer(t, claimRefsLeftMetric, peers.IPAMExtensions) - left; d != 6 {
				t.Errorf("%s{peer=%q} rose by %v, want 6", claimRefsLeftMetric, peers.IPAMExtensions, d)
			}
		})
	}
	if !t.Failed() {
		framework.CheckDocTable(t, "ipam-extensions-kubevirt", []string{"order", "VM", "claims", "each launcher pod carries (start / restart)", "who put it there", "after the VM is deleted"}, rows)
	}
}

// createIPAMExtVMs creates, in namespace secondary, two persistent-IP NADs
// and VM db on both and, in namespace udn, a primary layer2 UDN and VM web
// on it asking for an IP and a MAC; both run (runStrategy Always). It
// returns what each must get.
func createIPAMExtVMs(t *testing.T, secondary, udn string) []ipamExtVM {
	t.Helper()
	persistentNAD(t, secondary, "tenant")
	persistentNAD(t, secondary, "extra")
	mustCreateVM(t, secondary, vmYAML("db",
		"\n            - {name: blue, bridge: {}}\n            - {name: green, bridge: {}}",
		"\n        - {name: blue, multus: {networkName: tenant}}\n        - {name: green, multus: {networkName: extra}}", ""))
	env.CreateNAD(t, udn, "udn", "", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"%[1]s_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.220.0.0/16","netAttachDefName":"%[1]s/udn","allowPersistentIPs":true}`, udn))
	mustCreateVM(t, udn, udnVMYAML("web", "Always", `network.kubevirt.io/addresses: '{"default":["10.220.0.9"]}'`))
	return []ipamExtVM{
		{doc: "two secondary networks", ns: secondary, name: "db", claims: []string{"db.blue", "db.green"}, refs: map[string]string{"tenant": "db.blue", "extra": "db.green"},
			leftBy: "claim-refs", left: []string{"blue", "green"}},
		{doc: "primary UDN (IP and MAC asked for)", ns: udn, name: "web", claims: []string{"web.default"}, refs: map[string]string{}, primary: "web.default",
			leftBy: "primary-udn", left: []string{"default"}},
	}
}

// startIPAMExt starts ipam-extensions, its webhook configuration named
// configuration, for one test. When the test ends it is uninstalled (again,
// if the test did) and the test waits until kvnet's cache no longer has
// its webhook, so that no later test finds kvnet stepping aside; a failed
// test gets its log.
func startIPAMExt(t *testing.T, configuration string) *framework.IPAMExtensions {
	t.Helper()
	ie, err := framework.StartIPAMExtensions(context.Background(), env.Config, env.Client, t.TempDir(), framework.IPAMExtensionsOptions{ConfigurationName: configuration})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("ipam-extensions' log (%s), last lines:\n%s", ie.LogPath, ie.Tail(40))
		}
		ie.Stop()
		waitPeerCached(t, configuration, false)
	})
	return ie
}

// waitPeerCached waits until kvnet's cache has (or no longer has) the
// webhook configuration ipam-extensions registered under name: kvnet
// decides from its cache whether to leave claims to it.
func waitPeerCached(t *testing.T, name string, present bool) {
	t.Helper()
	framework.Eventually(t, fmt.Sprintf("kvnet's cache has ipam-extensions' webhook: %v", present), framework.CacheTimeout, func() error {
		var list admissionregv1.MutatingWebhookConfigurationList
		if err := env.Manager.GetCache().List(context.Background(), &list); err != nil {
			return err
		}
		if got := peers.IPAMExtensionsIn(list.Items); strings.HasPrefix(got, name+"/") != present {
			return fmt.Errorf("cached ipam-extensions webhook configuration %q", got)
		}
		return nil
	})
}

// checkIPAMExtLauncherPod checks the claim references of one launcher pod
// virt-controller rendered.
// It returns what the pod carries and who put it there, for
// docs/peers.md.
func checkIPAMExtLauncherPod(t *testing.T, run int, want ipamExtVM, pod *corev1.Pod) (carries, who string) {
	t.Helper()
	carries = checkClaimRefs(t, run, want, pod)
	return carries, checkLeftToIPAMExt(t, run, want, pod)
}

// checkClaimRefs checks that one launcher pod references want's claims,
// each once, and says what it carries.
func checkClaimRefs(t *testing.T, run int, want ipamExtVM, pod *corev1.Pod) string {
	t.Helper()
	elems, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
	if err != nil && len(want.refs) > 0 {
		t.Fatalf("run %d: launcher pod of %s: %v", run, want.name, err)
	}
	got := map[string]string{}
	for _, e := range elems {
		if ref := e.String(multus.KeyIPAMClaimReference); ref != "" {
			if _, dup := got[e.Name()]; dup {
				t.Errorf("run %d: two elements for NAD %s", run, e.Name())
			}
			got[e.Name()] = ref
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want.refs) {
		t.Errorf("run %d: launcher pod of %s references %v, want %v (annotation %s)", run, want.name, got, want.refs, pod.Annotations[multus.NetworksAnnotation])
	}
	carries := fmt.Sprintf("%d `ipam-claim-reference`", len(got))
	if want.primary != "" {
		def, err := multus.ParseDefaultNetwork(pod.Annotations[multus.DefaultNetworkAnnotation])
		carries = fmt.Sprintf("%d default-network element", len(def))
		if err != nil || len(def) != 1 || def[0].String(multus.KeyIPAMClaimReference) != want.primary {
			t.Errorf("run %d: launcher pod of %s has %s %q, want one element referencing %s", run, want.name, multus.DefaultNetworkAnnotation, pod.Annotations[multus.DefaultNetworkAnnotation], want.primary)
		}
	}
	return carries
}

// checkLeftToIPAMExt checks that kvnet.io/mutations of one launcher pod
// says kvnet left want's references to ipam-extensions.
func checkLeftToIPAMExt(t *testing.T, run int, want ipamExtVM, pod *corev1.Pod) (who string) {
	t.Helper()
	var changes []chain.Change
	if raw := pod.Annotations[chain.MutationsAnnotation]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &changes); err != nil {
			t.Fatalf("run %d: %s of %s's launcher pod: %v", run, chain.MutationsAnnotation, want.name, err)
		}
	}
	var left []string
	for _, c := range changes {
		if c.LeftTo == peers.IPAMExtensions && c.Mutator == want.leftBy {
			left = c.Networks
		}
	}
	if !slices.Equal(left, want.left) {
		t.Errorf("run %d: %s of %s's launcher pod %+v says %s left %v to ipam-extensions, want %v", run, chain.MutationsAnnotation, want.name, changes, want.leftBy, left, want.left)
		return "kvnet"
	}
	return "ipam-extensions; kvnet left them to it"
}

// checkClaimsOnce checks that the VM's namespace holds exactly its claims,
// each with the VM as its one (controller) owner.
func checkClaimsOnce(t *testing.T, want ipamExtVM) {
	t.Helper()
	ctx := context.Background()
	var vm kubevirtv1.VirtualMachine
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: want.ns, Name: want.name}, &vm); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "the claims of "+want.name, waitTimeout, func() error {
		var list ipamv1alpha1.IPAMClaimList
		if err := env.Client.List(ctx, &list, client.InNamespace(want.ns)); err != nil {
			return err
		}
		var names []string
		for _, c := range list.Items {
			names = append(names, c.Name)
			if n := len(c.OwnerReferences); n != 1 || c.OwnerReferences[0].UID != vm.UID || !ptr.Deref(c.OwnerReferences[0].Controller, false) {
				t.Fatalf("claim %s has owners %+v, want VM %s alone as controller", c.Name, c.OwnerReferences, want.name)
			}
		}
		if fmt.Sprint(names) != fmt.Sprint(want.claims) {
			return fmt.Errorf("claims %v, want %v", names, want.claims)
		}
		return nil
	})
}

// setRunStrategy stops or starts a VM as a user does.
func setRunStrategy(t *testing.T, ns, name string, s kubevirtv1.VirtualMachineRunStrategy) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vm kubevirtv1.VirtualMachine
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &vm); err != nil {
			return err
		}
		vm.Spec.RunStrategy = ptr.To(s)
		return env.Client.Update(context.Background(), &vm)
	})
	if err != nil {
		t.Fatalf("setting runStrategy %s on %s: %v", s, name, err)
	}
}

// waitGone waits until obj no longer exists.
func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	framework.Eventually(t, fmt.Sprintf("%T %s gone", obj, obj.GetName()), waitTimeout, func() error {
		cur := obj.DeepCopyObject().(client.Object)
		err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), cur)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there (finalizers %v, deletionTimestamp %v)", cur.GetFinalizers(), cur.GetDeletionTimestamp())
	})
}

// deleteVMAndWaitClaimsFree deletes the VM as a user does and waits until
// it is gone and no finalizer holds its claims (the garbage collector,
// which envtest does not run, then deletes them by their owner reference).
func deleteVMAndWaitClaimsFree(t *testing.T, want ipamExtVM) {
	t.Helper()
	ctx := context.Background()
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: want.ns, Name: want.name}}
	if err := env.Client.Delete(ctx, vm); err != nil {
		t.Fatalf("deleting VM %s: %v", want.name, err)
	}
	waitGone(t, vm)
	for _, name := range want.claims {
		framework.Eventually(t, "no finalizer on claim "+name, waitTimeout, func() error {
			var c ipamv1alpha1.IPAMClaim
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: want.ns, Name: name}, &c)
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
