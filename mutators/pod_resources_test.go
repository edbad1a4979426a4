package mutators

import (
	"context"
	"maps"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

const (
	nrSRIOV = "intel.com/sriov_netdevice"
	nrVDPA  = "jaguarmicro.com/jaguar"
)

// nrFacts: vf and vf2 share an SR-IOV resource, vd is vDPA, br has none;
// rack pins its network to nodes labelled rack=r1, rack2 to rack=r2, and
// bad has a node selector with two labels.
func nrFacts() *lookup.Snapshot {
	mk := func(name string, ann map[string]string) nadv1.NetworkAttachmentDefinition {
		return nadv1.NetworkAttachmentDefinition{
			ObjectMeta: metav1.ObjectMeta{Namespace: crNS, Name: name, Annotations: ann},
			Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.4.0","name":"` + name + `","type":"sriov"}`},
		}
	}
	res := func(r string) map[string]string { return map[string]string{netattach.ResourceNameAnnotation: r} }
	return lookup.NewSnapshot([]nadv1.NetworkAttachmentDefinition{
		mk("vf", res(nrSRIOV)),
		mk("vf2", res(nrSRIOV)),
		mk("vd", res(nrVDPA)),
		mk("br", nil),
		mk("rack", map[string]string{netattach.ResourceNameAnnotation: nrSRIOV, netattach.NodeSelectorAnnotation: " rack = r1 "}),
		mk("rack2", map[string]string{netattach.NodeSelectorAnnotation: "rack=r2"}),
		mk("flag", map[string]string{netattach.NodeSelectorAnnotation: "example.com/sriov"}),
		mk("bad", map[string]string{netattach.NodeSelectorAnnotation: "a=b=c"}),
	}, nil, nil)
}

type nrPod struct {
	networks, defaultNetwork string
	requests, limits         corev1.ResourceList // of compute
	sidecar                  corev1.ResourceList // requests of a second container
	nodeSelector             map[string]string
	noCompute                bool
}

func (p nrPod) build() *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: crNS, Name: "virt-launcher-web-x", Annotations: map[string]string{}}}
	if p.networks != "" {
		pod.Annotations[multus.NetworksAnnotation] = p.networks
	}
	if p.defaultNetwork != "" {
		pod.Annotations[multus.DefaultNetworkAnnotation] = p.defaultNetwork
	}
	name := ComputeContainer
	if p.noCompute {
		name = "other"
	}
	pod.Spec.Containers = []corev1.Container{{Name: name, Resources: corev1.ResourceRequirements{Requests: maps.Clone(p.requests), Limits: maps.Clone(p.limits)}}}
	if p.sidecar != nil {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "hook-sidecar-0", Resources: corev1.ResourceRequirements{Requests: p.sidecar}})
	}
	pod.Spec.NodeSelector = maps.Clone(p.nodeSelector)
	return pod
}

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func rlString(l corev1.ResourceList) map[string]string {
	out := map[string]string{}
	for k, v := range l {
		out[string(k)] = v.String()
	}
	return out
}

// virt-launcher pods as virt-controller v1.9.0 creates them: with
// ExternalNetResourceInjection on (the default) the compute container has
// only cpu and memory, with it off it also has one unit per Multus network.
func TestNetworkResources(t *testing.T) {
	base := rl("cpu", "100m", "memory", "1Gi")
	with := func(l corev1.ResourceList, kv ...string) corev1.ResourceList {
		out := maps.Clone(l)
		maps.Copy(out, rl(kv...))
		return out
	}
	sriov := `[{"name":"vf","namespace":"tenant-a","interface":"pod1"}]`
	for name, c := range map[string]struct {
		pod          nrPod
		op           admissionv1.Operation
		cfg          string
		wantRequests corev1.ResourceList // nil: compute unchanged
		wantLimits   corev1.ResourceList
		wantSelector map[string]string
		refused      string
		warning      string
		recorded     bool
	}{
		"gate on: one SR-IOV network gets one VF": {
			pod:          nrPod{networks: sriov, requests: base, limits: rl("memory", "1Gi")},
			wantRequests: with(base, nrSRIOV, "1"), wantLimits: rl("memory", "1Gi", nrSRIOV, "1"), recorded: true,
		},
		"two attachments on NADs of one resource are summed": {
			pod:          nrPod{networks: `[{"name":"vf","interface":"a"},{"name":"vf2","interface":"b"},{"name":"vf","interface":"c"}]`, requests: base},
			wantRequests: with(base, nrSRIOV, "3"), wantLimits: rl(nrSRIOV, "3"), recorded: true,
		},
		"SR-IOV and vDPA, each counted; a bridge needs nothing": {
			pod:          nrPod{networks: "vf@a, vd@b, br@c", requests: base},
			wantRequests: with(base, nrSRIOV, "1", nrVDPA, "1"), wantLimits: rl(nrSRIOV, "1", nrVDPA, "1"), recorded: true,
		},
		"the Multus default network counts too": {
			pod:          nrPod{defaultNetwork: `[{"name":"vd","namespace":"tenant-a"}]`, networks: sriov},
			wantRequests: rl(nrSRIOV, "1", nrVDPA, "1"), wantLimits: rl(nrSRIOV, "1", nrVDPA, "1"), recorded: true,
		},
		"gate off: KubeVirt wrote the resource, no double count": {
			pod: nrPod{networks: `[{"name":"vf","interface":"a"},{"name":"vf2","interface":"b"}]`, requests: with(base, nrSRIOV, "2"), limits: rl(nrSRIOV, "2")},
		},
		"network-resources-injector ran first (limits only is enough)": {
			pod: nrPod{networks: sriov, requests: base, limits: rl(nrSRIOV, "1")},
		},
		"set in another container: left alone": {
			pod: nrPod{networks: sriov, requests: base, sidecar: rl(nrSRIOV, "1")},
		},
		"one resource set, the other missing: only the missing one is added": {
			pod:          nrPod{networks: "vf@a, vd@b", requests: with(base, nrSRIOV, "1"), limits: rl(nrSRIOV, "1")},
			wantRequests: with(base, nrSRIOV, "1", nrVDPA, "1"), wantLimits: rl(nrSRIOV, "1", nrVDPA, "1"), recorded: true,
		},
		"resources.inject never": {
			pod: nrPod{networks: sriov, requests: base}, cfg: "resources: {inject: never}\n",
		},
		"UPDATE (NIC hotplug rewrites the annotation) changes nothing": {
			pod: nrPod{networks: sriov, requests: base}, op: admissionv1.Update,
		},
		"a missing NAD costs only its attachment": {
			pod:          nrPod{networks: "gone@a, vf@b", requests: base},
			wantRequests: with(base, nrSRIOV, "1"), wantLimits: rl(nrSRIOV, "1"), recorded: true,
			warning: "tenant-a/gone does not exist",
		},
		"no compute container": {
			pod: nrPod{networks: sriov, noCompute: true}, warning: `no "compute" container`,
		},
		"node selector added, spaces trimmed, with the resource": {
			pod:          nrPod{networks: "rack@a", nodeSelector: map[string]string{"kubernetes.io/arch": "amd64"}},
			wantRequests: rl(nrSRIOV, "1"), wantLimits: rl(nrSRIOV, "1"), recorded: true,
			wantSelector: map[string]string{"kubernetes.io/arch": "amd64", "rack": "r1"},
		},
		"node selector of a NAD without a resource; a bare key means an empty value": {
			pod:          nrPod{networks: "rack2@a, flag@b"},
			wantSelector: map[string]string{"rack": "r2", "example.com/sriov": ""}, recorded: true,
		},
		"node selector the pod already has: nothing to add": {
			pod:          nrPod{networks: "rack2@a", nodeSelector: map[string]string{"rack": "r2"}},
			wantSelector: map[string]string{"rack": "r2"},
		},
		"the VM selects another value of the NAD's label": {
			pod:     nrPod{networks: "rack2@a", nodeSelector: map[string]string{"rack": "r9"}},
			refused: `the pod selects nodes with rack="r9", but NetworkAttachmentDefinition tenant-a/rack2 exists only on nodes with rack="r2"`,
		},
		"two NADs ask for two values of one label": {
			pod:     nrPod{networks: "rack@a, rack2@b"},
			refused: `two values of node label "rack": "r1" (NetworkAttachmentDefinition tenant-a/rack) and "r2" (tenant-a/rack2)`,
		},
		"a node selector annotation with two labels": {
			pod:     nrPod{networks: "bad@a"},
			refused: `NetworkAttachmentDefinition tenant-a/bad: annotation k8s.v1.cni.cncf.io/nodeSelector "a=b=c" holds more than one label`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := udnConfig(t, c.cfg)
			op := c.op
			if op == "" {
				op = admissionv1.Create
			}
			pod := c.pod.build()
			before := pod.DeepCopy()
			req := &chain.PodRequest{Operation: op, Namespace: crNS, Pod: pod, Config: cfg, Facts: nrFacts()}
			err := NetworkResources{}.MutatePod(context.Background(), req)
			if c.refused != "" {
				if err == nil || !strings.Contains(err.Error(), c.refused) {
					t.Fatalf("err = %v, want a refusal containing %q", err, c.refused)
				}
				if _, ok := err.(*chain.Refusal); !ok {
					t.Fatalf("err %T is not a refusal (it would answer 500)", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := pod.Spec.Containers[0].Resources
			wantReq, wantLim := c.wantRequests, c.wantLimits
			if wantReq == nil {
				wantReq, wantLim = before.Spec.Containers[0].Resources.Requests, before.Spec.Containers[0].Resources.Limits
			}
			if !maps.Equal(rlString(got.Requests), rlString(wantReq)) || !maps.Equal(rlString(got.Limits), rlString(wantLim)) {
				t.Errorf("compute resources = requests %v limits %v, want %v / %v", rlString(got.Requests), rlString(got.Limits), rlString(wantReq), rlString(wantLim))
			}
			wantSel := c.wantSelector
			if wantSel == nil {
				wantSel = before.Spec.NodeSelector
			}
			if !maps.Equal(pod.Spec.NodeSelector, wantSel) {
				t.Errorf("nodeSelector = %v, want %v", pod.Spec.NodeSelector, wantSel)
			}
			if (len(req.Changes) > 0) != c.recorded {
				t.Errorf("recorded %v, want a record: %v", req.Changes, c.recorded)
			}
			if w := strings.Join(req.Warnings, "\n"); (c.warning == "") != (w == "") || !strings.Contains(w, c.warning) {
				t.Errorf("warnings %q, want %q", w, c.warning)
			}
			// Reinvoked on its own output (the API server's IfNeeded
			// reinvocation): nothing more, nothing recorded.
			again := &chain.PodRequest{Operation: op, Namespace: crNS, Pod: pod.DeepCopy(), Config: cfg, Facts: nrFacts()}
			if err := (NetworkResources{}).MutatePod(context.Background(), again); err != nil {
				t.Fatal(err)
			}
			if len(again.Changes) > 0 || !podSpecEqual(again.Pod, pod) {
				t.Errorf("second run changed the pod again: %v", again.Changes)
			}
		})
	}
}

func podSpecEqual(a, b *corev1.Pod) bool {
	if !maps.Equal(a.Spec.NodeSelector, b.Spec.NodeSelector) || len(a.Spec.Containers) != len(b.Spec.Containers) {
		return false
	}
	for i := range a.Spec.Containers {
		x, y := a.Spec.Containers[i].Resources, b.Spec.Containers[i].Resources
		if !maps.Equal(rlString(x.Requests), rlString(y.Requests)) || !maps.Equal(rlString(x.Limits), rlString(y.Limits)) {
			return false
		}
	}
	return true
}

// BenchmarkNetworkResources is the launcher-pod path of an SR-IOV VM with
// two VFs and a vDPA device, against ClaimRefs on the same pod shape (the
// launcher-pod mutator kvnet already ran on every pod) as the baseline.
func BenchmarkNetworkResources(b *testing.B) {
	cfg := udnConfig(b, "")
	facts := nrFacts()
	ctx := context.Background()
	p := nrPod{networks: `[{"name":"vf","interface":"a"},{"name":"vf2","interface":"b"},{"name":"vd","interface":"c"}]`, requests: rl("cpu", "100m", "memory", "1Gi")}
	var base float64
	b.Run("baseline-claim-refs", func(b *testing.B) {
		vmi := crVMI()
		m := ClaimRefs{Cache: cacheReader{{Namespace: vmi.Namespace, Name: vmi.Name}: vmi}}
		annotation := crElems("blue", "red", "plain", "gone")
		c := config.Config{}.Default("")
		f := crFacts()
		b.ReportAllocs()
		for b.Loop() {
			req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: crNS, Pod: crPod(annotation), Config: &c, Facts: f}
			if err := m.MutatePod(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
		base = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("network-resources", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: crNS, Pod: p.build(), Config: cfg, Facts: facts}
			if err := (NetworkResources{}).MutatePod(ctx, req); err != nil {
				b.Fatal(err)
			}
			if len(req.Changes) == 0 {
				b.Fatal("nothing added")
			}
		}
		if base > 0 {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/base, "ns/op-vs-claim-refs")
		}
	})
}
