package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// The VM of examples/vms.yaml whose secondary network keeps its IP: network
// "tenant" on NAD tenant-a/tenant-l2, which allows persistent IPs.
const (
	persistentNS      = "tenant-a"
	persistentVM      = "web"
	persistentNetwork = "tenant"
	persistentNAD     = "tenant-l2"
)

// kubeVirtWait bounds each wait on KubeVirt's and kvnet's controllers: they
// answer in well under a second, but the machine may be shared.
const kubeVirtWait = 90 * time.Second

// launch is what one start of the VM produced.
type launch struct {
	vmi   *kubevirtv1.VirtualMachineInstance
	pod   *corev1.Pod
	claim *ipamv1alpha1.IPAMClaim
}

// showLaunch waits for virt-controller to turn the running VM into a VMI
// and a virt-launcher pod, and for kvnet to reference the VM's claim from
// that pod's Multus element and to own the claim; it prints all three.
// notVMI skips a VMI that is still the one of an earlier start.
func showLaunch(ctx context.Context, c client.Client, notVMI types.UID, say sayFunc) (*launch, error) {
	key := client.ObjectKey{Namespace: persistentNS, Name: persistentVM}
	l := &launch{}
	err := poll(ctx, kubeVirtWait, "virt-controller to create VMI "+key.String(), func() error {
		var vmi kubevirtv1.VirtualMachineInstance
		if err := c.Get(ctx, key, &vmi); err != nil {
			return err
		}
		if vmi.UID == notVMI || vmi.DeletionTimestamp != nil {
			return fmt.Errorf("only the earlier VMI %s exists", vmi.UID)
		}
		l.vmi = &vmi
		return nil
	})
	if err != nil {
		return nil, err
	}
	say("    VMI %s  uid=%s  phase=%s  (created by virt-controller, owner VirtualMachine/%s)", key, l.vmi.UID, l.vmi.Status.Phase, persistentVM)
	if l.pod, err = waitLauncherPod(ctx, c, l.vmi); err != nil {
		return nil, err
	}
	lines, err := formatElements(l.pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", l.pod.Name, err)
	}
	say("    Pod %s/%s (rendered by virt-controller, completed by kvnet), %s:", l.pod.Namespace, l.pod.Name, multus.NetworksAnnotation)
	for _, line := range lines {
		say("      - %s", line)
	}
	want := persistentips.ClaimName(persistentVM, persistentNetwork)
	elem, err := podElement(l.pod, persistentNAD)
	if err != nil {
		return nil, err
	}
	if got := elem.String(multus.KeyIPAMClaimReference); got != want {
		return nil, fmt.Errorf("the launcher pod's %s element has ipam-claim-reference %q, want %q", persistentNAD, got, want)
	}
	if l.claim, err = waitOwnedClaim(ctx, c, want, elem.Interface()); err != nil {
		return nil, err
	}
	say("    IPAMClaims owned by VirtualMachine %s:", key)
	say("      - %s", formatClaim(l.claim))
	return l, nil
}

// waitLauncherPod waits for the VMI's virt-launcher pod (label
// kubevirt.io/created-by=<VMI UID>, as virt-controller sets it).
func waitLauncherPod(ctx context.Context, c client.Client, vmi *kubevirtv1.VirtualMachineInstance) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := poll(ctx, kubeVirtWait, "virt-controller to create VMI "+vmi.Name+"'s virt-launcher pod", func() error {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(vmi.Namespace), client.MatchingLabels{kubevirtv1.CreatedByLabel: string(vmi.UID)}); err != nil {
			return err
		}
		if len(pods.Items) == 0 {
			return errors.New("no pod yet")
		}
		pod = &pods.Items[0]
		return nil
	})
	return pod, err
}

// podElement is the pod's Multus element for a NAD of the pod's namespace.
func podElement(pod *corev1.Pod, nad string) (*multus.Element, error) {
	elems, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	for _, e := range elems {
		if e.Refers(pod.Namespace, pod.Namespace, nad) {
			return e, nil
		}
	}
	return nil, fmt.Errorf("pod %s has no Multus element for NAD %s (annotation %q)", pod.Name, nad, pod.Annotations[multus.NetworksAnnotation])
}

// waitOwnedClaim waits until kvnet's persistent-IPs controller has created
// the claim, controlled by the VM, for the pod interface KubeVirt gave the
// network.
func waitOwnedClaim(ctx context.Context, c client.Client, name, iface string) (*ipamv1alpha1.IPAMClaim, error) {
	var vm kubevirtv1.VirtualMachine
	if err := c.Get(ctx, client.ObjectKey{Namespace: persistentNS, Name: persistentVM}, &vm); err != nil {
		return nil, err
	}
	var claim ipamv1alpha1.IPAMClaim
	err := poll(ctx, kubeVirtWait, "kvnet to create IPAMClaim "+persistentNS+"/"+name, func() error {
		var claims ipamv1alpha1.IPAMClaimList
		if err := c.List(ctx, &claims, client.InNamespace(persistentNS)); err != nil {
			return err
		}
		for _, cl := range claims.Items {
			if o := metav1.GetControllerOf(&cl); o == nil || o.UID != vm.UID {
				continue
			}
			if cl.Name != name {
				return stopPolling{fmt.Errorf("VM %s owns claim %s, want %s", persistentVM, cl.Name, name)}
			}
			if cl.Spec.Interface != iface {
				return stopPolling{fmt.Errorf("claim %s names interface %q, the launcher pod's element %q", name, cl.Spec.Interface, iface)}
			}
			claim = cl
			return nil
		}
		return errors.New("no claim owned by the VM yet")
	})
	return &claim, err
}

// showRestart stops the VM and starts it again, as `virtctl stop` and
// `virtctl start` do (runStrategy Halted, then Always), and shows that the
// new VMI's new launcher pod references the very claim of the first start.
func showRestart(ctx context.Context, c client.Client, first *launch, say sayFunc) error {
	key := client.ObjectKey{Namespace: persistentNS, Name: persistentVM}
	say("    stopping: VirtualMachine %s runStrategy Halted", key)
	if err := setRunStrategy(ctx, c, key, kubevirtv1.RunStrategyHalted); err != nil {
		return err
	}
	err := poll(ctx, kubeVirtWait, "virt-controller to delete VMI "+key.String()+" and its pod", func() error {
		err := c.Get(ctx, key, &kubevirtv1.VirtualMachineInstance{})
		if err == nil {
			return errors.New("the VMI still exists")
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		err = c.Get(ctx, client.ObjectKeyFromObject(first.pod), &corev1.Pod{})
		if err == nil {
			return fmt.Errorf("pod %s still exists", first.pod.Name)
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	var claim ipamv1alpha1.IPAMClaim
	if err := c.Get(ctx, client.ObjectKeyFromObject(first.claim), &claim); err != nil {
		return fmt.Errorf("IPAMClaim %s after the stop: %w", first.claim.Name, err)
	}
	if claim.UID != first.claim.UID {
		return fmt.Errorf("IPAMClaim %s was recreated during the stop (uid %s, was %s)", claim.Name, claim.UID, first.claim.UID)
	}
	say("    stopped: VMI %s and pod %s are gone; the claim stays:", first.vmi.UID, first.pod.Name)
	say("      - %s", formatClaim(&claim))
	say("    starting: VirtualMachine %s runStrategy Always", key)
	if err := setRunStrategy(ctx, c, key, kubevirtv1.RunStrategyAlways); err != nil {
		return err
	}
	again, err := showLaunch(ctx, c, first.vmi.UID, say)
	if err != nil {
		return err
	}
	if again.claim.UID != first.claim.UID {
		return fmt.Errorf("the second start's claim has uid %s, the first's %s: the IP would not survive", again.claim.UID, first.claim.UID)
	}
	say("    same claim (uid %s) across the restart: new VMI %s, new pod %s", again.claim.UID, again.vmi.UID, again.pod.Name)
	return nil
}

func setRunStrategy(ctx context.Context, c client.Client, key client.ObjectKey, rs kubevirtv1.VirtualMachineRunStrategy) error {
	vm := &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	patch := fmt.Sprintf(`{"spec":{"runStrategy":%q}}`, rs)
	if err := c.Patch(ctx, vm, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		return fmt.Errorf("setting VM %s runStrategy %s: %w", key, rs, err)
	}
	return nil
}
