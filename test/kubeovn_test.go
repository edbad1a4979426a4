package test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const kubeOVNConfig = `{"cniVersion":"0.3.0","type":"kube-ovn","server_socket":"/run/openvswitch/kube-ovn-daemon.sock"%s}`

// kube-ovn attachments get their annotations on the VM template, keyed by
// the provider: the NAD's provider field when set, <nad>.<ns>.ovn otherwise.
// Only the attachment asked for gets the default route. The suite's config
// turns legacyLiveMigration on (kube-ovn <= 1.12), so the API server relays
// kvnet's warning that kube-ovn >= 1.13 ignores it.
func TestKubeOVNAnnotationsOnTemplate(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "ovn-a", "", fmt.Sprintf(kubeOVNConfig, ""))
	env.CreateNAD(t, ns, "ovn-b", "", fmt.Sprintf(kubeOVNConfig, `,"provider":"custom.provider.ovn"`))
	c, warnings := warningClient(t)
	_, err := createVM(t, c, ns, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: web
  annotations:
    kvnet.io/networks: '[{"name":"a","nad":"ovn-a"},{"name":"b","nad":"ovn-b","defaultRoute":true}]'
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {}
        resources: {requests: {memory: 1Gi}}
`)
	if err != nil {
		t.Fatal(err)
	}
	ann := getVM(t, ns, "web").Spec.Template.ObjectMeta.Annotations
	want := map[string]string{
		"ovn-a." + ns + ".ovn.kubernetes.io/allow_live_migration": "true",
		"custom.provider.ovn.kubernetes.io/allow_live_migration":  "true",
		"custom.provider.ovn.kubernetes.io/default_route":         "true",
	}
	for k, v := range want {
		if ann[k] != v {
			t.Errorf("template annotation %s = %q, want %q", k, ann[k], v)
		}
	}
	if v, ok := ann["ovn-a."+ns+".ovn.kubernetes.io/default_route"]; ok {
		t.Errorf("ovn-a got default_route=%q; only b asked for it", v)
	}
	if w := strings.Join(warnings.all(), "\n"); !strings.Contains(w, "network a, b: allow_live_migration") || !strings.Contains(w, "kube-ovn >= v1.13 ignores it") {
		t.Errorf("admission warnings %q lack the kube-ovn >= 1.13 warning", w)
	}
}

// Two default routes cannot both win. Asked twice in one annotation, the
// annotation is refused; asked once by kvnet while the owner wrote another by
// hand, the validator refuses the second annotation.
func TestTwoDefaultRoutesRefused(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "ovn-a", "", fmt.Sprintf(kubeOVNConfig, ""))
	env.CreateNAD(t, ns, "ovn-b", "", fmt.Sprintf(kubeOVNConfig, ""))
	_, err := createVM(t, env.Client, ns, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: web
  annotations:
    kvnet.io/networks: '[{"name":"a","nad":"ovn-a","defaultRoute":true},{"name":"b","nad":"ovn-b","defaultRoute":true}]'
spec:
  template:
    spec:
      domain:
        devices: {}
        resources: {requests: {memory: 1Gi}}
`)
	hasCause(t, err, "metadata.annotations[kvnet.io/networks]", "only one network may carry the default route")

	_, err = createVM(t, env.Client, ns, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: web2
  annotations:
    kvnet.io/networks: '[{"name":"b","nad":"ovn-b","defaultRoute":true}]'
spec:
  template:
    metadata:
      annotations: {ovn-a.`+ns+`.ovn.kubernetes.io/default_route: "true"}
    spec:
      domain:
        devices:
          interfaces: [{name: a, bridge: {}}]
        resources: {requests: {memory: 1Gi}}
      networks: [{name: a, multus: {networkName: ovn-a}}]
`)
	hasCause(t, err, "spec.template.metadata.annotations[ovn-b."+ns+".ovn.kubernetes.io/default_route]", "only one network may carry the default route")
}

// A virt-launcher pod, as virt-controller creates it, of a VM kvnet never
// saw: the pod mutator adds allow_live_migration for its kube-ovn attachment.
func TestKubeOVNLauncherPodCompleted(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "ovn-a", "", fmt.Sprintf(kubeOVNConfig, ""))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:    ns,
			GenerateName: "virt-launcher-legacy-",
			Labels: map[string]string{
				"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": "0b7c5f1e-2222-4a3b-8c9d-000000000002", "vm.kubevirt.io/name": "legacy",
			},
			Annotations: map[string]string{
				"kubevirt.io/domain":          "legacy",
				"k8s.v1.cni.cncf.io/networks": `[{"name":"ovn-a","namespace":"` + ns + `","interface":"pod2c7b4a5e9a1"}]`,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "legacy",
				UID: "0b7c5f1e-2222-4a3b-8c9d-000000000002", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}}},
	}
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), &got); err != nil {
		t.Fatal(err)
	}
	if v := got.Annotations["ovn-a."+ns+".ovn.kubernetes.io/allow_live_migration"]; v != "true" {
		t.Fatalf("launcher pod annotations = %v, want allow_live_migration on ovn-a", got.Annotations)
	}
	if got.Annotations["k8s.v1.cni.cncf.io/networks"] != pod.Annotations["k8s.v1.cni.cncf.io/networks"] {
		t.Fatalf("networks annotation changed: %s", got.Annotations["k8s.v1.cni.cncf.io/networks"])
	}
}

// A pod without KubeVirt's labels is never sent to kvnet, whatever it holds.
func TestOrdinaryPodUntouched(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "ovn-a", "", fmt.Sprintf(kubeOVNConfig, ""))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nginx", Annotations: map[string]string{
			"k8s.v1.cni.cncf.io/networks": "ovn-a",
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx"}}},
	}
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Annotations) != 1 {
		t.Fatalf("ordinary pod was mutated: %v", got.Annotations)
	}
	_ = kubevirtv1.GroupVersion
}
