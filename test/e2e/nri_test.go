package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/test/framework"
)

// nriTestLabel selects the namespaces where nriConfig's rule injects an
// SR-IOV network into every VM.
const nriTestLabel = "kvnet.io/nri-test"

// nriConfig is the tier's config with one more rule: kvnet injects vfinj
// (NAD sriov-c, the SR-IOV resource) into each VM of a labelled namespace.
var nriConfig = strings.Replace(testConfig, "networkRules:\n", `networkRules:
  - name: nri-vf
    namespaceSelector:
      matchLabels: {`+nriTestLabel+`: "true"}
    networks:
      - {name: vfinj, nad: sriov-c}
`, 1)

const resourcesLeftMetric = "kvnet_launcher_resources_left_to_peer_total"

// nriCase is one way of running network-resources-injector beside kvnet.
type nriCase struct {
	order string // which webhook the API server calls first
	// configuration names NRI's MutatingWebhookConfiguration: "kvnet" sorts
	// before the shipped name and after "0-...".
	configuration string
	honor         bool
	// webhook, when set, renames NRI's webhook to one kvnet does not know.
	webhook string
}

// outcome is what the launcher pod's compute container got.
type outcome struct {
	vfRequests, vfLimits     int64 // intel.com/sriov_netdevice
	vdpaRequests, vdpaLimits int64 // jaguarmicro.com/vdpa
	leftTo                   bool
}

// network-resources-injector v1.9.0, built from its module and run as its
// Deployment runs it (its RBAC, its token, mTLS to the API server, its
// installer's webhook configuration by URL), beside kvnet and KubeVirt's
// virt-controller and virt-api. A VM with two SR-IOV interfaces of one
// resource, and a third that kvnet injects by rule, gets a launcher pod
// whose compute container asks for exactly three VFs (requests and
// limits), whichever webhook the API server calls first (name order) and
// with or without -honor-resources: kvnet sees the injector's webhook and
// leaves the resources to it, and says so in kvnet.io/mutations, its
// metric and its log. Registered under a webhook name kvnet does not
// know, the injector with -honor-resources after kvnet asks for six: the
// double count kvnet steps aside to avoid. The table in docs/peers.md is
// these outcomes (KVNET_UPDATE_DOCS=1 rewrites it).
func TestBesideNetworkResourcesInjector(t *testing.T) {
	restore, err := env.SetConfig(nriConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restore)
	const unknown = "sriov-injector-mutating-config.k8s.cni.cncf.io"
	cases := []nriCase{
		{order: "kvnet, then NRI", configuration: framework.NRIConfiguration},
		{order: "kvnet, then NRI", configuration: framework.NRIConfiguration, honor: true},
		{order: "NRI, then kvnet", configuration: "0-" + framework.NRIConfiguration},
		{order: "NRI, then kvnet", configuration: "0-" + framework.NRIConfiguration, honor: true},
		{order: "kvnet, then NRI", configuration: framework.NRIConfiguration, honor: true, webhook: unknown},
		{order: "NRI, then kvnet", configuration: "0-" + framework.NRIConfiguration, honor: true, webhook: unknown},
	}
	var rows []string
	for i, c := range cases {
		name := "kvnet-first"
		if strings.HasPrefix(c.order, "NRI") {
			name = "nri-first"
		}
		if c.honor {
			name += "-honor"
		}
		if c.webhook != "" {
			name += "-unknown-webhook"
		}
		t.Run(name, func(t *testing.T) {
			got := runBesideNRI(t, i, c)
			want := outcome{vfRequests: 3, vfLimits: 3, vdpaRequests: 1, vdpaLimits: 1, leftTo: true}
			if c.webhook != "" {
				want.leftTo = false
				if c.honor && strings.HasPrefix(c.order, "kvnet") {
					want = outcome{vfRequests: 6, vfLimits: 6, vdpaRequests: 2, vdpaLimits: 2}
				}
			}
			if got != want {
				t.Errorf("launcher pod: %+v, want %+v", got, want)
			}
			rows = append(rows, nriRow(c, got))
		})
	}
	if !t.Failed() && len(rows) == len(cases) {
		framework.CheckDocTable(t, "nri", []string{"NRI's webhook", "order", "NRI mode", "VFs, requests / limits (want 3)", "vDPA devices (want 1)", "who added them"}, rows)
	}
}

// runBesideNRI starts NRI as c says, creates the VM and reads its launcher pod.
func runBesideNRI(t *testing.T, i int, c nriCase) outcome {
	ctx := context.Background()
	nri, err := env.StartNRI(ctx, framework.NRIOptions{ConfigurationName: c.configuration, HonorResources: c.honor, WebhookName: c.webhook})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("network-resources-injector's log (%s), last lines:\n%s", nri.LogPath, nri.Tail(40))
		}
		nri.Stop()
	})
	ns := env.NewNamespace(t, map[string]string{nriTestLabel: "true"})
	resourceNADs(t, ns)
	env.CreateNAD(t, ns, "sriov-c", sriovResource, fmt.Sprintf(sriovNADConfig, "sriov-c"))
	left := leftToPeer(t, resourcesLeftMetric, peers.ResourceInjector)

	name := fmt.Sprintf("nri%d", i)
	pod := launcherOf(t, ns, name, vmYAML(name, `
            - {name: vf0, sriov: {}}
            - {name: vf1, sriov: {}}
            - {name: fast}`, `
        - {name: vf0, multus: {networkName: sriov-a}}
        - {name: vf1, multus: {networkName: sriov-b}}
        - {name: fast, multus: {networkName: vdpa-net}}`, ""))
	cc := compute(t, pod)
	q := func(l corev1.ResourceList, r corev1.ResourceName) int64 { v := l[r]; return v.Value() }
	got := outcome{
		vfRequests: q(cc.Resources.Requests, sriovResource), vfLimits: q(cc.Resources.Limits, sriovResource),
		vdpaRequests: q(cc.Resources.Requests, vdpaResource), vdpaLimits: q(cc.Resources.Limits, vdpaResource),
		leftTo: leftTo(t, pod),
	}
	// The vDPA binding's sidecar is a second container; NRI patches
	// containers[0], which must be compute.
	if pod.Spec.Containers[0].Name != "compute" || len(pod.Spec.Containers) < 2 {
		t.Errorf("launcher pod %s: containers %v; want compute first and the vdpa sidecar after it", pod.Name, containerNames(pod))
	}
	for _, c := range pod.Spec.Containers[1:] {
		for _, r := range []corev1.ResourceName{sriovResource, vdpaResource} {
			if _, ok := c.Resources.Requests[r]; ok {
				t.Errorf("launcher pod %s: container %s asks for %s too", pod.Name, c.Name, r)
			}
		}
	}
	if got.leftTo {
		if d := leftToPeer(t, resourcesLeftMetric, peers.ResourceInjector) - left; d != 2 {
			t.Errorf("kvnet_launcher_resources_left_to_peer_total{peer=%q} rose by %v, want 2 (two resources)", peers.ResourceInjector, d)
		}
		if d := env.Logs.Count("leaving the pod's device resources to network-resources-injector, which the API server calls for it", "namespace", ns, "pod", pod.GenerateName); d != 1 {
			t.Errorf("kvnet logged %d lines, want 1, for leaving %s's resources to network-resources-injector", d, pod.Name)
		}
	}
	return got
}

// leftTo reports whether the pod's kvnet.io/mutations says kvnet left its
// device resources, for all four networks, to network-resources-injector.
func leftTo(t *testing.T, pod *corev1.Pod) bool {
	t.Helper()
	raw := pod.Annotations[chain.MutationsAnnotation]
	if raw == "" {
		return false
	}
	var changes []chain.Change
	if err := json.Unmarshal([]byte(raw), &changes); err != nil {
		t.Fatalf("pod %s: %s: %v", pod.Name, chain.MutationsAnnotation, err)
	}
	for _, c := range changes {
		if c.Mutator == "network-resources" && c.LeftTo == peers.ResourceInjector {
			if len(c.Networks) != 4 {
				t.Errorf("pod %s: left to %s for %v, want the four device networks", pod.Name, c.LeftTo, c.Networks)
			}
			return true
		}
	}
	return false
}

func containerNames(pod *corev1.Pod) []string {
	var out []string
	for _, c := range pod.Spec.Containers {
		out = append(out, c.Name)
	}
	return out
}

// leftToPeer reads counter metric's series for peer.
func leftToPeer(t *testing.T, metric, peer string) float64 {
	t.Helper()
	return counterWith(t, metric, map[string]string{"peer": peer})
}

// counterWith reads the first series of counter metric that has every
// label of labels (0 when none has).
func counterWith(t *testing.T, metric string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != metric {
			continue
		}
		for _, m := range mf.GetMetric() {
			matched := 0
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched == len(labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// nriRow is one line of docs/peers.md's table.
func nriRow(c nriCase, o outcome) string {
	mode := "default"
	if c.honor {
		mode = "`-honor-resources`"
	}
	reg := "as shipped"
	if c.webhook != "" {
		reg = "webhook renamed (`" + c.webhook + "`)"
	}
	first, second := "kvnet", "NRI"
	if strings.HasPrefix(c.order, "NRI") {
		first, second = second, first
	}
	who := "NRI; kvnet left them to it"
	switch {
	case o.leftTo:
	case o.vfRequests == 3:
		who = first + "; " + second + " found them set"
	default:
		who = "both: NRI added its count to kvnet's"
	}
	return fmt.Sprintf("| %s | %s | %s | %d / %d | %d / %d | %s |", reg, c.order, mode, o.vfRequests, o.vfLimits, o.vdpaRequests, o.vdpaLimits, who)
}
