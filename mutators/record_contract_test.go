package mutators_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/mutators"
)

// The webhook computes a patch only when the chain recorded a change, and
// only over the request's Regions, so a mutator that changes the object
// without Record, or outside the regions, would have its change silently
// dropped. Over every example VM: the object changed exactly when changes
// were recorded, only inside the regions, and a second run changes nothing.
func TestChangesAreAlwaysRecorded(t *testing.T) {
	dir := filepath.Join("..", "examples")
	docs, err := offline.ReadFiles([]string{dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	facts, err := offline.Facts(docs)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data, "")
	if err != nil {
		t.Fatal(err)
	}
	vms := 0
	for _, d := range docs {
		if d.Kind != string(chain.KindVM) {
			continue
		}
		vms++
		var vm kubevirtv1.VirtualMachine
		if err := json.Unmarshal(d.Raw, &vm); err != nil {
			t.Fatal(err)
		}
		for run := 1; run <= 2; run++ {
			before, _ := json.Marshal(&vm)
			req := chain.ForVM(&vm)
			req.Config, req.Facts = cfg, facts
			if chain.SkipReason(req) != "" {
				break
			}
			if err := chain.RunVMMutators(context.Background(), req, app.Chains(app.Capabilities{}).VM); err != nil {
				t.Fatalf("%s run %d: %v", d.Source, run, err)
			}
			after, _ := json.Marshal(&vm)
			changed := !bytes.Equal(before, after)
			if changed != (len(req.Changes) > 0) {
				t.Errorf("%s run %d: object changed=%v but recorded %v", d.Source, run, changed, req.Changes)
			}
			if err := onlyRegionsChanged(before, after, req.Regions()); err != nil {
				t.Errorf("%s run %d: %v", d.Source, run, err)
			}
			if run == 2 && changed {
				t.Errorf("%s: the second run changed the object again (not idempotent)", d.Source)
			}
		}
	}
	if vms < 4 {
		t.Fatalf("only %d example VMs found", vms)
	}
}

// onlyRegionsChanged reports a difference between before and after that lies
// outside every region: before with each region's value taken from after
// must equal after.
func onlyRegionsChanged(before, after []byte, regions chain.Regions) error {
	var b, a map[string]any
	if err := json.Unmarshal(before, &b); err != nil {
		return err
	}
	if err := json.Unmarshal(after, &a); err != nil {
		return err
	}
	for _, p := range regions.Pointers() {
		segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
		v, ok := lookupPath(a, segs)
		setPath(b, segs, v, ok)
	}
	nb, _ := json.Marshal(b)
	na, _ := json.Marshal(a)
	if !bytes.Equal(nb, na) {
		return fmt.Errorf("a mutator changed the object outside chain.Request.Regions:\n regions applied: %s\n mutated:         %s", nb, na)
	}
	return nil
}

func lookupPath(m map[string]any, segs []string) (any, bool) {
	cur := any(m)
	for _, s := range segs {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[s]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func setPath(m map[string]any, segs []string, v any, present bool) {
	for _, s := range segs[:len(segs)-1] {
		next, ok := m[s].(map[string]any)
		if !ok {
			if !present {
				return
			}
			next = map[string]any{}
			m[s] = next
		}
		m = next
	}
	if present {
		m[segs[len(segs)-1]] = v
	} else {
		delete(m, segs[len(segs)-1])
	}
}

// The pod webhook patches a pod's spec (node selector, containers'
// resources) only when a pod mutator recorded a change, so the same contract
// holds for the launcher-pod mutators that need no VMI: over a launcher pod
// per example NAD, one attaching all of them, and one where KubeVirt already
// wrote the resources, the spec changed exactly when changes were recorded,
// the record reached kvnet.io/mutations, and a second run changes nothing.
func TestPodChangesAreAlwaysRecorded(t *testing.T) {
	docs, err := offline.ReadFiles([]string{filepath.Join("..", "examples")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	facts, err := offline.Facts(docs)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Config{}.Default("")
	type nadRef struct{ ns, name string }
	var nads []nadRef
	for _, d := range docs {
		if d.Kind != "NetworkAttachmentDefinition" {
			continue
		}
		var m struct {
			Metadata struct{ Name, Namespace string }
		}
		if err := json.Unmarshal(d.Raw, &m); err != nil {
			t.Fatal(err)
		}
		nads = append(nads, nadRef{m.Metadata.Namespace, m.Metadata.Name})
	}
	if len(nads) < 3 {
		t.Fatalf("only %d example NADs", len(nads))
	}
	pod := func(networks []string, requests corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "virt-launcher-x", Annotations: map[string]string{multus.NetworksAnnotation: strings.Join(networks, ",")}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: mutators.ComputeContainer, Resources: corev1.ResourceRequirements{Requests: requests}}}},
		}
	}
	var all []string
	var pods []*corev1.Pod
	for i, n := range nads {
		ref := n.ns + "/" + n.name + "@net" + strconv.Itoa(i)
		all = append(all, ref)
		pods = append(pods, pod([]string{ref}, nil))
	}
	pods = append(pods, pod(all, nil), pod(all, corev1.ResourceList{"intel.com/sriov_netdevice": resource.MustParse("1"), "jaguarmicro.com/jaguar": resource.MustParse("1")}))
	ms := []chain.PodMutator{mutators.KubeOVNPod{}, mutators.AddressesPod{}, mutators.NetworkResources{}}
	changedAny := false
	for i, p := range pods {
		for run := 1; run <= 2; run++ {
			before, _ := json.Marshal(p.Spec)
			req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: p.Namespace, Pod: p, Config: &cfg, Facts: facts}
			if err := chain.RunPodMutators(context.Background(), req, ms); err != nil {
				t.Fatalf("pod %d run %d: %v", i, run, err)
			}
			after, _ := json.Marshal(p.Spec)
			changed := !bytes.Equal(before, after)
			changedAny = changedAny || changed
			if changed != (len(req.Changes) > 0) {
				t.Errorf("pod %d run %d: spec changed=%v but recorded %v", i, run, changed, req.Changes)
			}
			if changed && !strings.Contains(p.Annotations[chain.MutationsAnnotation], "network-resources") {
				t.Errorf("pod %d: %s = %q lacks the record", i, chain.MutationsAnnotation, p.Annotations[chain.MutationsAnnotation])
			}
			if run == 2 && changed {
				t.Errorf("pod %d: the second run changed the spec again (not idempotent)", i)
			}
		}
	}
	if !changedAny {
		t.Fatal("no example NAD made any pod change: the test proves nothing")
	}
}
