package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

const (
	resSRIOV = "intel.com/sriov_netdevice"
	resVDPA  = "jaguarmicro.com/jaguar"
)

// resLauncher creates a virt-launcher pod (KubeVirt's label, a compute
// container) attaching networks, and returns it as stored (or the error).
func resLauncher(t *testing.T, ns, networks string, compute *corev1.ResourceRequirements, nodeSelector map[string]string) (*corev1.Pod, error) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, GenerateName: "virt-launcher-res-",
			Labels:      map[string]string{"kubevirt.io": "virt-launcher"},
			Annotations: map[string]string{"kubevirt.io/domain": "res", multus.NetworksAnnotation: networks},
		},
		Spec: corev1.PodSpec{
			NodeSelector: nodeSelector,
			Containers: []corev1.Container{
				{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"},
				{Name: "guest-console-log", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"},
			},
		},
	}
	if compute != nil {
		pod.Spec.Containers[0].Resources = *compute
	}
	if err := env.Client.Create(context.Background(), pod); err != nil {
		return nil, err
	}
	return piStoredPod(t, pod), nil
}

func resList(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func resStrings(l corev1.ResourceList) map[string]string {
	out := map[string]string{}
	for k, q := range l {
		out[string(k)] = q.String()
	}
	return out
}

func resNAD(t *testing.T, ns, name string, annotations map[string]string) {
	t.Helper()
	nad := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: fmt.Sprintf(`{"cniVersion":"0.4.0","name":%q,"type":"sriov"}`, name)},
	}
	if err := env.Client.Create(context.Background(), nad); err != nil {
		t.Fatal(err)
	}
	env.WaitCached(t, &nadv1.NetworkAttachmentDefinition{}, client.ObjectKeyFromObject(nad))
}

// Launcher pods as virt-controller v1.9.0 writes them, through the real API
// server and kvnet's launcher-pod webhook: with ExternalNetResourceInjection
// on (no device resources) the compute container gets one unit per
// attachment, summed per resource, and the NAD's node label; with it off
// (KubeVirt wrote them) nothing is counted twice; a pod without any
// resources member gets it whole; a node label the VM contradicts refuses
// the pod with a message naming both.
func TestLauncherPodNetworkResources(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	res := func(r string) map[string]string { return map[string]string{netattach.ResourceNameAnnotation: r} }
	resNAD(t, ns, "vf-a", res(resSRIOV))
	resNAD(t, ns, "vf-b", res(resSRIOV))
	resNAD(t, ns, "vd", res(resVDPA))
	resNAD(t, ns, "rack", map[string]string{netattach.ResourceNameAnnotation: resSRIOV, netattach.NodeSelectorAnnotation: "example.com/rack=r1"})
	elems := func(nads ...string) string {
		var out []string
		for i, n := range nads {
			out = append(out, fmt.Sprintf(`{"name":%q,"namespace":%q,"interface":"pod%d"}`, n, ns, i))
		}
		return "[" + strings.Join(out, ",") + "]"
	}
	cpuMem := func() *corev1.ResourceRequirements {
		return &corev1.ResourceRequirements{Requests: resList("cpu", "100m", "memory", "1Gi"), Limits: resList("memory", "1Gi")}
	}

	t.Run("gate on: SR-IOV twice and vDPA", func(t *testing.T) {
		pod, err := resLauncher(t, ns, elems("vf-a", "vf-b", "vd"), cpuMem(), map[string]string{"kubernetes.io/arch": "amd64"})
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[0].Resources
		if want := map[string]string{"cpu": "100m", "memory": "1Gi", resSRIOV: "2", resVDPA: "1"}; !maps.Equal(resStrings(c.Requests), want) {
			t.Errorf("compute requests %v, want %v", resStrings(c.Requests), want)
		}
		if want := map[string]string{"memory": "1Gi", resSRIOV: "2", resVDPA: "1"}; !maps.Equal(resStrings(c.Limits), want) {
			t.Errorf("compute limits %v, want %v", resStrings(c.Limits), want)
		}
		if r := pod.Spec.Containers[1].Resources; len(r.Requests)+len(r.Limits) != 0 {
			t.Errorf("the second container got resources %v", r)
		}
		if !maps.Equal(pod.Spec.NodeSelector, map[string]string{"kubernetes.io/arch": "amd64"}) {
			t.Errorf("nodeSelector %v changed without a NAD asking", pod.Spec.NodeSelector)
		}
		var rec []chain.Change
		if err := json.Unmarshal([]byte(pod.Annotations[chain.MutationsAnnotation]), &rec); err != nil || len(rec) != 1 || rec[0].Mutator != "network-resources" || len(rec[0].Networks) != 3 {
			t.Errorf("%s = %q (%v), want the network-resources record of the three NADs", chain.MutationsAnnotation, pod.Annotations[chain.MutationsAnnotation], err)
		}
	})

	t.Run("gate off: KubeVirt wrote them, no double count", func(t *testing.T) {
		written := cpuMem()
		maps.Copy(written.Requests, resList(resSRIOV, "2", resVDPA, "1"))
		maps.Copy(written.Limits, resList(resSRIOV, "2", resVDPA, "1"))
		pod, err := resLauncher(t, ns, elems("vf-a", "vf-b", "vd"), written.DeepCopy(), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[0].Resources
		if !maps.Equal(resStrings(c.Requests), resStrings(written.Requests)) || !maps.Equal(resStrings(c.Limits), resStrings(written.Limits)) {
			t.Errorf("compute resources %v / %v, want KubeVirt's %v / %v", resStrings(c.Requests), resStrings(c.Limits), resStrings(written.Requests), resStrings(written.Limits))
		}
		if a := pod.Annotations[chain.MutationsAnnotation]; a != "" {
			t.Errorf("kvnet recorded %q on a pod it did not change", a)
		}
	})

	t.Run("no resources member, no nodeSelector member", func(t *testing.T) {
		pod, err := resLauncher(t, ns, elems("rack"), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		c := pod.Spec.Containers[0].Resources
		if want := map[string]string{resSRIOV: "1"}; !maps.Equal(resStrings(c.Requests), want) || !maps.Equal(resStrings(c.Limits), want) {
			t.Errorf("compute resources %v / %v, want %v", resStrings(c.Requests), resStrings(c.Limits), want)
		}
		if want := map[string]string{"example.com/rack": "r1"}; !maps.Equal(pod.Spec.NodeSelector, want) {
			t.Errorf("nodeSelector %v, want %v", pod.Spec.NodeSelector, want)
		}
	})

	t.Run("the VM selects another rack", func(t *testing.T) {
		_, err := resLauncher(t, ns, elems("rack"), cpuMem(), map[string]string{"example.com/rack": "r7"})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `example.com/rack="r7"`) || !strings.Contains(err.Error(), ns+"/rack") {
			t.Fatalf("err = %v, want a 403 naming the pod's label and the NAD", err)
		}
	})
}
