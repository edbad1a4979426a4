// Package owner decides, in one place, which KubeVirt object controls an
// object: a VMI started by a VirtualMachine, a claim kept for a VM or a
// standalone VMI. The claim controller, the launcher-pod steps and the
// webhook's decoder all ask it, so they cannot disagree.
package owner

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Kinds of the KubeVirt objects that control VMIs and IPAMClaims.
const (
	KindVM  = "VirtualMachine"
	KindVMI = "VirtualMachineInstance"
)

// group is KubeVirt's API group; any of its versions counts.
const group = "kubevirt.io"

// ControllingVM returns obj's controller owner reference when it is a
// kubevirt.io VirtualMachine, else nil. Only the controller counts (an
// owner reference without controller: true is not who made obj), and only
// KubeVirt's VirtualMachine (a kind of that name in another API group is
// someone else's).
func ControllingVM(obj metav1.Object) *metav1.OwnerReference {
	return controller(obj, KindVM)
}

// ControllingKubeVirt returns obj's controller owner reference when it is
// a kubevirt.io VirtualMachine or VirtualMachineInstance, else nil.
func ControllingKubeVirt(obj metav1.Object) *metav1.OwnerReference {
	return controller(obj, KindVM, KindVMI)
}

func controller(obj metav1.Object, kinds ...string) *metav1.OwnerReference {
	ref := metav1.GetControllerOf(obj)
	if ref == nil || !inGroup(ref.APIVersion) {
		return nil
	}
	for _, k := range kinds {
		if ref.Kind == k {
			return ref
		}
	}
	return nil
}

// inGroup reports whether apiVersion ("kubevirt.io/v1") is KubeVirt's.
func inGroup(apiVersion string) bool {
	g, _, ok := strings.Cut(apiVersion, "/")
	return ok && g == group
}
