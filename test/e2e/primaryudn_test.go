package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/test/framework"
)

// udnVMYAML is a VM on the pod network of a namespace whose primary network
// is a UDN: a MAC on the pod interface and, on the template,
// the IP it asks for in network.kubevirt.io/addresses (which KubeVirt copies
// to the VMI).
func udnVMYAML(name, runStrategy, templateAnnotations string) string {
	return `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: ` + name + `
spec:
  runStrategy: ` + runStrategy + `
  template:
    metadata:
      labels: {kubevirt.io/vm: ` + name + `}
      annotations: {` + templateAnnotations + `}
    spec:
      domain:
        memory: {guest: 1Gi}
        devices:
          disks: [{name: containerdisk, disk: {bus: virtio}}]
          interfaces:
            - {name: default, masquerade: {}, macAddress: "02:00:00:00:20:01"}
      networks:
        - {name: default, pod: {}}
      volumes:
        - {name: containerdisk, containerDisk: {image: quay.io/containerdisks/fedora:latest}}
`
}

// udnEnable switches persistentIPs.primaryUDN on for one test and creates
// OVN-Kubernetes' default-network NAD (ovn-kubernetes/default), which the
// element names.
func udnEnable(t *testing.T) {
	t.Helper()
	restore, err := env.SetConfig(testConfig + "persistentIPs: {primaryUDN: {enabled: true}}\n")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restore)
	udnDefaultNAD(t)
}

// udnDefaultNAD creates OVN-Kubernetes' default-network NAD for one test.
func udnDefaultNAD(t *testing.T) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ovn-kubernetes"}}
	if err := env.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	env.CreateNAD(t, "ovn-kubernetes", "default", "", `{"cniVersion":"0.4.0","name":"ovn-kubernetes","type":"ovn-k8s-cni-overlay"}`)
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "ovn-kubernetes", Name: "default"}})
	})
}

// The launcher pod virt-controller really renders for a VM on a primary
// layer2 UDN carries, as stored, the default-network element with the
// claim reference, the VM interface's MAC and the requested IP, and the
// legacy claim annotation; the claim exists and is owned by the VM.
func TestPrimaryUDNClaimInRealLauncherPod(t *testing.T) {
	udnEnable(t)
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "udn", "", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"%[1]s_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.220.0.0/16","netAttachDefName":"%[1]s/udn","allowPersistentIPs":true}`, ns))
	vm := mustCreateVM(t, ns, udnVMYAML("web", "Always", `network.kubevirt.io/addresses: '{"default":["10.220.0.9"]}'`))

	vmi := waitVMI(t, ns, "web")
	pod := waitLauncherPod(t, vmi)
	claimName := persistentips.ClaimName("web", "default")
	want := `[{"name":"default","namespace":"ovn-kubernetes","ips":["10.220.0.9/16"],"mac":"02:00:00:00:20:01","ipam-claim-reference":"` + claimName + `"}]`
	if got := pod.Annotations[multus.DefaultNetworkAnnotation]; got != want {
		t.Errorf("launcher pod %s\n got %s\nwant %s", multus.DefaultNetworkAnnotation, got, want)
	}
	if got := pod.Annotations[primaryudn.LegacyClaimAnnotation]; got != claimName {
		t.Errorf("launcher pod %s = %q, want %q", primaryudn.LegacyClaimAnnotation, got, claimName)
	}
	claim := waitClaim(t, ns, claimName)
	if o := metav1.GetControllerOf(claim); o == nil || o.Kind != "VirtualMachine" || o.Name != "web" || o.UID != vm.UID {
		t.Errorf("claim controller = %+v, want VM web (%s)", o, vm.UID)
	}
	if !controllerutil.ContainsFinalizer(claim, persistentips.Finalizer) {
		t.Errorf("claim finalizers %v, want %s", claim.Finalizers, persistentips.Finalizer)
	}
	if claim.Spec.Network != ns+"_udn" || claim.Spec.Interface != persistentips.PrimaryUDNInterface {
		t.Errorf("claim spec %+v, want network %s_udn on %s", claim.Spec, ns, persistentips.PrimaryUDNInterface)
	}
}

// A VM whose template carries a default-network annotation of its own
// (which KubeVirt copies to the launcher pod) is refused by kvnet when it is
// created, naming the annotation: its pod would be refused. One admitted
// before primaryUDN was switched on gets no pod when it starts: kvnet
// refuses the pod naming the annotation, and virt-controller reports that
// on the VMI.
func TestPrimaryUDNRefusesForeignDefaultNetwork(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "udn", "", fmt.Sprintf(`{"cniVersion":"1.0.0","name":"%[1]s_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.220.0.0/16","allowPersistentIPs":true}`, ns))
	own := `v1.multus-cni.io/default-network: ` + ns + `/mine`
	// Admitted while the switch is off, not started yet.
	mustCreateVM(t, ns, udnVMYAML("early", "Halted", own))
	udnEnable(t)

	_, err := createVM(t, ns, udnVMYAML("own", "Always", own))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.template.metadata.annotations[v1.multus-cni.io/default-network]") {
		t.Fatalf("VM with its own default network: err = %v, want 422 naming the annotation", err)
	}

	// Starting the early VM is an UPDATE: the error its stored object
	// already had does not block it (ratcheting).
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var vm kubevirtv1.VirtualMachine
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "early"}, &vm); err != nil {
			return err
		}
		vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyAlways)
		return env.Client.Update(context.Background(), &vm)
	})
	if err != nil {
		t.Fatalf("starting VM early: %v", err)
	}
	vmi := waitVMI(t, ns, "early")
	framework.Eventually(t, "virt-controller reports kvnet's refusal of the launcher pod", waitTimeout, func() error {
		ctx := context.Background()
		var events corev1.EventList
		if err := env.Client.List(ctx, &events); err != nil {
			return err
		}
		var seen []string
		for _, e := range events.Items {
			if e.InvolvedObject.UID != vmi.UID {
				continue
			}
			if strings.Contains(e.Message, multus.DefaultNetworkAnnotation) && strings.Contains(e.Message, ns+"/mine") {
				t.Logf("virt-controller: %s: %s", e.Reason, e.Message)
				return nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		pods, _ := launcherPods(ctx, vmi)
		return fmt.Errorf("events %q; %d launcher pods", seen, len(pods))
	})
	if pods, err := launcherPods(context.Background(), vmi); err != nil || len(pods) != 0 {
		t.Errorf("launcher pods %d (%v), want none: kvnet refuses them", len(pods), err)
	}
}
