package test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/migholders"
	"github.com/kvnet/kvnet/webhook"
)

// admissionPoster sends AdmissionReviews straight to kvnet's webhook server,
// as the API server would: while the API server is down, nothing else can.
type admissionPoster struct {
	base   string
	client *http.Client
}

func newAdmissionPoster(t *testing.T) *admissionPoster {
	t.Helper()
	wio := &env.Env.WebhookInstallOptions
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(wio.LocalServingCAData) {
		t.Fatal("envtest's webhook CA does not parse")
	}
	return &admissionPoster{
		base: fmt.Sprintf("https://%s:%d", wio.LocalServingHost, wio.LocalServingPort),
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		}},
	}
}

// answer is kvnet's response to one AdmissionReview, or why there is none.
type answer struct {
	resp *admissionv1.AdmissionResponse
	err  error
}

// create posts a CREATE of obj to path and returns kvnet's answer.
func (p *admissionPoster) create(path string, gvk metav1.GroupVersionKind, resource, namespace string, obj any) answer {
	resp, err := p.post(path, gvk, resource, namespace, obj)
	return answer{resp, err}
}

func (p *admissionPoster) post(path string, gvk metav1.GroupVersionKind, resource, namespace string, obj any) (*admissionv1.AdmissionResponse, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: uuid.NewUUID(), Kind: gvk, Namespace: namespace, Operation: admissionv1.Create,
			Resource: metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resource},
			Object:   runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Post(p.base+path, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ar admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&ar); err != nil {
		return nil, fmt.Errorf("%s answered HTTP %d with no AdmissionReview: %w", path, resp.StatusCode, err)
	}
	if ar.Response == nil {
		return nil, fmt.Errorf("%s answered an AdmissionReview without a response", path)
	}
	return ar.Response, nil
}

var (
	gvkVM  = metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"}
	gvkPod = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
)

// wantAllowedPatch fails unless kvnet admitted with a patch containing want.
func wantAllowedPatch(a answer, want string) error {
	resp, err := a.resp, a.err
	if err != nil {
		return err
	}
	if !resp.Allowed {
		return fmt.Errorf("refused: %+v", resp.Result)
	}
	if !strings.Contains(string(resp.Patch), want) {
		return fmt.Errorf("patch %s lacks %q", resp.Patch, want)
	}
	return nil
}

// wantKvnetFailure fails unless kvnet refused with a 500 whose message
// contains every one of what: kvnet's own failure, saying what it was doing,
// never a 4xx that blames the user's object.
func wantKvnetFailure(a answer, what ...string) error {
	resp, err := a.resp, a.err
	if err != nil {
		return err
	}
	if resp.Allowed {
		return fmt.Errorf("admitted (patch %s), want a refusal: kvnet could not do its work", resp.Patch)
	}
	if resp.Result == nil || resp.Result.Code != http.StatusInternalServerError {
		return fmt.Errorf("refused with %+v, want code 500", resp.Result)
	}
	for _, w := range what {
		if !strings.Contains(resp.Result.Message, w) {
			return fmt.Errorf("message %q does not say %q", resp.Result.Message, w)
		}
	}
	return nil
}

// kube-apiserver stops (etcd keeps running) while kvnet runs, and comes back
// on the same address. Meanwhile AdmissionReviews keep coming, posted to
// kvnet directly as the API server would have sent them:
//   - what kvnet can decide from its caches it still answers, and the same
//     as before: a VM in a namespace of the storage rule gains the storage
//     network (NAD and namespace from the cache), a virt-launcher pod of a
//     cached VMI gets its IPAMClaim reference;
//   - what needs a write or a confirmation from the API server fails closed
//     with a 500 naming what kvnet was doing: a migration address for a new
//     node (the reservation write), a node whose address a live pod holds
//     (confirming the holder), a launcher pod whose VMI the cache lacks.
//
// After the restart kvnet's watches recover (a NAD created then reaches
// its cache; a VM on it gets its claim from the controller) and, once the
// controllers settled, every claim belongs to an existing VM, every VM has
// exactly the claims it needs, and every migration address is bound to
// exactly one live pod: nothing the outage interrupted is duplicated or
// leaked, including VMs whose create the outage cut off mid-way.
func TestAPIServerRestartWhileAdmitting(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, ns, "storage", "", fmt.Sprintf(bridgeConfig, "storage"))
	env.CreateNAD(t, ns, "migration", "", fmt.Sprintf(bridgeConfig, "migration"))
	piPersistentNAD(t, ns, "blue", "blue-net")
	// A short reservation timeout lets the leak check below wait for the
	// release of a reservation the outage orphaned, instead of 2 minutes.
	useConfig(t, testConfig+fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/migration
    pool: {cidr: 10.93.0.0/24}
  reservationTimeout: 5s
`, ns))

	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	nodes := []string{"outage-n0", "outage-n1"}
	for _, n := range nodes {
		migholders.Node(t, env.Client, n)
		t.Cleanup(func() { migholders.DeleteNode(t, env.Client, n) })
	}
	p0 := migholders.Create(t, env.Client, migholders.HandlerPod(ds, nodes[0], nil))
	t.Cleanup(func() { migholders.DeletePod(t, env.Client, p0) })
	migholders.WaitBound(t, env.Client, migration.PoolInCluster, migholders.Addr(t, p0, "migration", "migration0").Addr(), p0)

	vm := piVmWithNetworks(ns, "before", [2]string{"blue", "blue"})
	piCreateVM(t, vm)
	claimBefore := persistentips.ClaimName("before", "blue")
	piWaitClaim(t, ns, claimBefore, "VirtualMachine", "before", vm.UID, "blue-net", "blue")
	vmi := piStartVMI(t, vm)
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstance{}, client.ObjectKeyFromObject(vmi))

	post := newAdmissionPoster(t)
	outageVM := piVmWithNetworks(ns, "during", [2]string{"blue", "blue"})
	launcher := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, GenerateName: "virt-launcher-",
			Labels:      map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": string(vmi.UID)},
			Annotations: map[string]string{"kubevirt.io/domain": vmi.Name, "k8s.v1.cni.cncf.io/networks": piLauncherNetworks(vmi)},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}}},
	}
	ghost := launcher.DeepCopy()
	ghost.Annotations["kubevirt.io/domain"] = "not-in-cache"
	newNodePod := migholders.HandlerPod(ds, nodes[1], nil)
	heldNodePod := migholders.HandlerPod(ds, nodes[0], nil)
	// Each round is one request of every kind; the expectations hold
	// whether the API server is up, stopping, or down.
	fromCache := func() error {
		if err := wantAllowedPatch(post.create(webhook.PathMutateVM, gvkVM, "virtualmachines", ns, outageVM), `"storage"`); err != nil {
			return fmt.Errorf("VM mutation from the NAD cache: %w", err)
		}
		if err := wantAllowedPatch(post.create(webhook.PathMutateLauncherPods, gvkPod, "pods", ns, launcher), `ipam-claim-reference\":\"`+claimBefore+`\"`); err != nil {
			return fmt.Errorf("claim reference from the claim cache: %w", err)
		}
		return nil
	}
	if err := wantAllowedPatch(post.create(webhook.PathMutateVM, gvkVM, "virtualmachines", ns, outageVM), `"storage"`); err != nil {
		t.Fatalf("before the outage: %v", err)
	}

	// Admission from the caches keeps going through the stop and the start.
	stopLoad := make(chan struct{})
	var loadErr error
	var loadRounds int
	var wg sync.WaitGroup
	wg.Go(func() {
		pace := time.NewTicker(20 * time.Millisecond) // a steady stream, not a busy loop
		defer pace.Stop()
		for {
			select {
			case <-stopLoad:
				return
			case <-pace.C:
			}
			if err := fromCache(); err != nil && loadErr == nil {
				loadErr = err
			}
			loadRounds++
		}
	})
	// VMs keep being created through the API server; while it is down the
	// creates fail, and one cut off mid-way may or may not be stored.
	var creates sync.WaitGroup
	creates.Go(func() {
		pace := time.NewTicker(100 * time.Millisecond)
		defer pace.Stop()
		for i := 0; ; i++ {
			select {
			case <-stopLoad:
				return
			case <-pace.C:
			}
			v := piVmWithNetworks(ns, fmt.Sprintf("load-%d", i), [2]string{"blue", "blue"})
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = env.Client.Create(c, v)
			cancel()
		}
	})

	down := false
	t.Cleanup(func() {
		if down {
			if err := env.StartAPIServer(); err != nil {
				t.Errorf("restarting kube-apiserver after a failed test: %v", err)
			}
		}
	})
	if err := env.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	down = true

	// While it is down: answers from the cache, refusals where kvnet needs
	// the API server.
	if err := fromCache(); err != nil {
		t.Fatalf("API server down: %v", err)
	}
	if err := wantKvnetFailure(post.create(webhook.PathMutateMigrationPods, gvkPod, "pods", ns, newNodePod), "creating allocation", "kvnet-mig-ic-10-93-0-"); err != nil {
		t.Fatalf("migration address for a new node while the API server is down: %v", err)
	}
	if err := wantKvnetFailure(post.create(webhook.PathMutateMigrationPods, gvkPod, "pods", ns, heldNodePod), "checking pod", p0.Name); err != nil {
		t.Fatalf("migration address of a node whose pod may still hold it, while the API server is down: %v", err)
	}
	if err := wantKvnetFailure(post.create(webhook.PathMutateLauncherPods, gvkPod, "pods", ns, ghost), "reading VirtualMachineInstance", ns+"/not-in-cache"); err != nil {
		t.Fatalf("launcher pod of a VMI the cache lacks, while the API server is down: %v", err)
	}

	if err := env.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	down = false
	close(stopLoad)
	wg.Wait()
	creates.Wait()
	if loadErr != nil {
		t.Fatalf("admission from the caches during the restart (%d rounds): %v", loadRounds, loadErr)
	}
	t.Logf("%d rounds of admission from the caches ran through the restart", loadRounds)

	// kvnet's watches recover: a NAD created now reaches its cache, and the
	// persistent-IP controller sees a VM on it.
	late := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "late"},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: fmt.Sprintf(piPersistentConfig, "late-net", ns+"/late")},
	}
	framework.Eventually(t, "NAD created after the restart", 60*time.Second, func() error { return env.Client.Create(ctx, late) })
	framework.Eventually(t, "NAD created after the restart in kvnet's cache", 120*time.Second, func() error {
		return env.Manager.GetCache().Get(ctx, client.ObjectKeyFromObject(late), &nadv1.NetworkAttachmentDefinition{})
	})
	after := piVmWithNetworks(ns, "after", [2]string{"late", "late"})
	piCreateVM(t, after)
	if got := getVM(t, ns, "after").Spec.Template.Spec.Networks; !hasNetwork(got, "storage") {
		t.Fatalf("VM created after the restart was not mutated: networks %v", got)
	}
	// The node refused during the outage gets its address now.
	p1 := migholders.Create(t, env.Client, newNodePod)
	t.Cleanup(func() { migholders.DeletePod(t, env.Client, p1) })
	a1 := migholders.Addr(t, p1, "migration", "migration0").Addr()
	if a0 := migholders.Addr(t, p0, "migration", "migration0").Addr(); a0 == a1 {
		t.Fatalf("%s given to the virt-handlers of %s and %s", a0, nodes[0], nodes[1])
	}

	// Settled: every address bound to exactly one live pod, every claim
	// to an existing VM, every VM with exactly its claim.
	framework.Eventually(t, "migration addresses bound one to one to the live pods", 90*time.Second, func() error {
		allocs := migholders.Allocations(t, env.Client, migration.PoolInCluster)
		want := map[netip.Addr]*corev1.Pod{migholders.Addr(t, p0, "migration", "migration0").Addr(): p0, a1: p1}
		if len(allocs) != len(want) {
			return fmt.Errorf("%d allocations for %d pods: %v", len(allocs), len(want), allocationList(allocs))
		}
		for _, a := range allocs {
			p := want[a.Address]
			if p == nil || a.State != migration.StateBound || a.PodUID != p.UID {
				return fmt.Errorf("allocation %s is %s for %s: %v", a.Address, a.State, a.Holder(), allocationList(allocs))
			}
		}
		return nil
	})
	framework.Eventually(t, "one claim per VM network, none without its VM", 90*time.Second, func() error {
		var vms kubevirtv1.VirtualMachineList
		if err := env.Client.List(ctx, &vms, client.InNamespace(ns)); err != nil {
			return err
		}
		var claims ipamv1alpha1.IPAMClaimList
		if err := env.Client.List(ctx, &claims, client.InNamespace(ns)); err != nil {
			return err
		}
		return claimsMatchVMs(vms.Items, claims.Items)
	})
}

// claimsMatchVMs checks that each VM has exactly one claim per network
// (every test VM here has one persistent network) and that no claim is
// left without its VM: nothing doubled, nothing leaked.
func claimsMatchVMs(vms []kubevirtv1.VirtualMachine, claims []ipamv1alpha1.IPAMClaim) error {
	want := map[string]types.UID{}
	for _, vm := range vms {
		for _, n := range vm.Spec.Template.Spec.Networks {
			// "storage" is the rule's bridge network: no persistent IPs.
			if n.Multus != nil && n.Name != "storage" {
				want[persistentips.ClaimName(vm.Name, n.Name)] = vm.UID
			}
		}
	}
	got := map[string]bool{}
	for _, c := range claims {
		ref := metav1.GetControllerOf(&c)
		uid, ok := want[c.Name]
		switch {
		case !ok:
			return fmt.Errorf("claim %s belongs to no VM network: leaked", c.Name)
		case ref == nil || ref.UID != uid:
			return fmt.Errorf("claim %s is not controlled by its VM (%v)", c.Name, ref)
		}
		got[c.Name] = true
	}
	for name := range want {
		if !got[name] {
			return fmt.Errorf("claim %s missing (%d claims for %d VM networks)", name, len(claims), len(want))
		}
	}
	return nil
}

func hasNetwork(nets []kubevirtv1.Network, name string) bool {
	for _, n := range nets {
		if n.Name == name {
			return true
		}
	}
	return false
}

func allocationList(as []*migration.Allocation) []string {
	var out []string
	for _, a := range as {
		out = append(out, fmt.Sprintf("%s=%s(%s)", a.Address, a.State, a.Holder()))
	}
	return out
}
