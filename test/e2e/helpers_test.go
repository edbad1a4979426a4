package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
)

// memLockGate is the feature gate virt-api requires before it admits
// spec.domain.memory.reservedOverhead.memLock.
const memLockGate = "ReservedOverheadMemlock"

// waitTimeout bounds the waits on KubeVirt's controllers: they answer in
// well under a second on an idle machine, but CI machines are shared.
const waitTimeout = 60 * time.Second

// vmYAML is a VM as a user writes it: the pod network, a container disk,
// runStrategy Always so that virt-controller starts it at once.
func vmYAML(name, extraIfaces, extraNets, annotations string) string {
	return `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: ` + name + `
  annotations: {` + annotations + `}
spec:
  runStrategy: Always
  template:
    metadata:
      labels: {kubevirt.io/vm: ` + name + `}
    spec:
      domain:
        memory: {guest: 1Gi}
        devices:
          disks: [{name: containerdisk, disk: {bus: virtio}}]
          interfaces:
            - {name: default, masquerade: {}}` + extraIfaces + `
      networks:
        - {name: default, pod: {}}` + extraNets + `
      volumes:
        - {name: containerdisk, containerDisk: {image: quay.io/containerdisks/fedora:latest}}
`
}

// createVM creates a VM from YAML in ns, as a user would.
func createVM(t *testing.T, ns, y string) (*kubevirtv1.VirtualMachine, error) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := yaml.UnmarshalStrict([]byte(y), &vm); err != nil {
		t.Fatalf("test VM: %v", err)
	}
	vm.Namespace = ns
	err := env.Client.Create(context.Background(), &vm)
	return &vm, err
}

// mustCreateVM creates a VM that kvnet and virt-api must both admit.
func mustCreateVM(t *testing.T, ns, y string) *kubevirtv1.VirtualMachine {
	t.Helper()
	vm, err := createVM(t, ns, y)
	if err != nil {
		t.Fatalf("creating VM: %v", err)
	}
	return vm
}

// waitVMI waits until virt-controller has created the VM's VMI.
func waitVMI(t *testing.T, ns, name string) *kubevirtv1.VirtualMachineInstance {
	t.Helper()
	var vmi kubevirtv1.VirtualMachineInstance
	framework.Eventually(t, "virt-controller creates VMI "+ns+"/"+name, waitTimeout, func() error {
		return env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &vmi)
	})
	return &vmi
}

// launcherPods lists the VMI's virt-launcher pods (source and, during a
// migration, target), found as KubeVirt finds them: by created-by label.
func launcherPods(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := env.Client.List(ctx, &pods, client.InNamespace(vmi.Namespace), client.MatchingLabels{kubevirtv1.CreatedByLabel: string(vmi.UID)})
	return pods.Items, err
}

// waitLauncherPod waits until virt-controller has created the VMI's first
// virt-launcher pod.
func waitLauncherPod(t *testing.T, vmi *kubevirtv1.VirtualMachineInstance) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	framework.Eventually(t, "virt-controller creates the virt-launcher pod of "+vmi.Name, waitTimeout, func() error {
		ctx := context.Background()
		pods, err := launcherPods(ctx, vmi)
		if err != nil || len(pods) == 0 {
			return fmt.Errorf("%d pods, %v; VMI conditions %s", len(pods), err, vmiConditions(ctx, vmi))
		}
		pod = pods[0]
		return nil
	})
	return &pod
}

// vmiConditions reads the VMI's conditions, to say why no pod appears.
func vmiConditions(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) string {
	var cur kubevirtv1.VirtualMachineInstance
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
		return err.Error()
	}
	var parts []string
	for _, c := range cur.Status.Conditions {
		parts = append(parts, fmt.Sprintf("%s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// selection parses the pod's Multus annotation and indexes it by NAD name.
func selection(t *testing.T, pod *corev1.Pod) map[string]*multus.Element {
	t.Helper()
	raw := pod.Annotations[multus.NetworksAnnotation]
	elems, err := multus.Parse(raw)
	if err != nil {
		t.Fatalf("pod %s: %s = %q: %v", pod.Name, multus.NetworksAnnotation, raw, err)
	}
	out := map[string]*multus.Element{}
	for _, e := range elems {
		out[e.Name()] = e
	}
	return out
}

// updateKubeVirt changes the KubeVirt CR's spec (its status is untouched: the
// CRD has a status subresource) and waits until kvnet's cache has it.
func updateKubeVirt(t *testing.T, change func(*kubevirtv1.KubeVirtSpec)) {
	t.Helper()
	ctx := context.Background()
	var kv kubevirtv1.KubeVirt
	key := client.ObjectKey{Namespace: "kubevirt", Name: "kubevirt"}
	if err := env.Client.Get(ctx, key, &kv); err != nil {
		t.Fatal(err)
	}
	change(&kv.Spec)
	if err := env.Client.Update(ctx, &kv); err != nil {
		t.Fatalf("updating the KubeVirt CR: %v", err)
	}
	framework.Eventually(t, "kvnet's cache has KubeVirt CR version "+kv.ResourceVersion, framework.CacheTimeout, func() error {
		var cached kubevirtv1.KubeVirt
		if err := env.Manager.GetCache().Get(ctx, key, &cached); err != nil {
			return err
		}
		if cached.ResourceVersion != kv.ResourceVersion {
			return fmt.Errorf("cache has version %s", cached.ResourceVersion)
		}
		return nil
	})
}
