package owner

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Which owner reference makes an object controlled by a VM (or a VMI).
func TestControllingVM(t *testing.T) {
	ref := func(apiVersion, kind string, controller *bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: "web", UID: "u", Controller: controller}
	}
	for name, tc := range map[string]struct {
		refs         []metav1.OwnerReference
		vm, kubevirt bool
	}{
		"VM controller":                      {refs: []metav1.OwnerReference{ref("kubevirt.io/v1", KindVM, ptr.To(true))}, vm: true, kubevirt: true},
		"VM controller, another version":     {refs: []metav1.OwnerReference{ref("kubevirt.io/v1alpha3", KindVM, ptr.To(true))}, vm: true, kubevirt: true},
		"VMI controller":                     {refs: []metav1.OwnerReference{ref("kubevirt.io/v1", KindVMI, ptr.To(true))}, kubevirt: true},
		"VM of another API group":            {refs: []metav1.OwnerReference{ref("example.com/v1", KindVM, ptr.To(true))}},
		"VM without apiVersion":              {refs: []metav1.OwnerReference{ref("", KindVM, ptr.To(true))}},
		"VM owner, not controller":           {refs: []metav1.OwnerReference{ref("kubevirt.io/v1", KindVM, nil)}},
		"VM owner, controller false":         {refs: []metav1.OwnerReference{ref("kubevirt.io/v1", KindVM, ptr.To(false))}},
		"another kind controls, VM owns too": {refs: []metav1.OwnerReference{ref("v1", "ConfigMap", ptr.To(true)), ref("kubevirt.io/v1", KindVM, nil)}},
		"no owner":                           {},
	} {
		obj := &metav1.ObjectMeta{OwnerReferences: tc.refs}
		if got := ControllingVM(obj) != nil; got != tc.vm {
			t.Errorf("%s: ControllingVM %v, want %v", name, got, tc.vm)
		}
		if got := ControllingKubeVirt(obj) != nil; got != tc.kubevirt {
			t.Errorf("%s: ControllingKubeVirt %v, want %v", name, got, tc.kubevirt)
		}
	}
}
