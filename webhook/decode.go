package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/chain"
)

// decodeVMish decodes a VM or VMI and returns the typed object together with a
// chain request whose pointers alias into it, so mutators change the object
// itself.
func decodeVMish(kind string, raw []byte) (any, *chain.Request, error) {
	if len(raw) == 0 {
		return nil, nil, fmt.Errorf("the request carries no object")
	}
	// json.Unmarshal takes null for an empty object; the patch for it
	// would then not apply to the request's object.
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, nil, fmt.Errorf("the request's object is not a JSON object")
	}
	switch kind {
	case chain.KindVM:
		var vm kubevirtv1.VirtualMachine
		if err := json.Unmarshal(raw, &vm); err != nil {
			return nil, nil, fmt.Errorf("decoding VirtualMachine: %w", err)
		}
		return &vm, chain.ForVM(&vm), nil
	case chain.KindVMI:
		var vmi kubevirtv1.VirtualMachineInstance
		if err := json.Unmarshal(raw, &vmi); err != nil {
			return nil, nil, fmt.Errorf("decoding VirtualMachineInstance: %w", err)
		}
		return &vmi, chain.ForVMI(&vmi), nil
	}
	return nil, nil, fmt.Errorf("kvnet does not handle kind %q", kind)
}

// fillRequest completes a decoded request with what the AdmissionReview says.
// The object's own namespace is empty on CREATE with generateName or when
// the client left it out; the review's namespace is authoritative.
func fillRequest(cr *chain.Request, ar *admissionv1.AdmissionRequest) {
	cr.Operation = ar.Operation
	if ar.Namespace != "" {
		cr.Namespace = ar.Namespace
	}
	if cr.Name == "" {
		cr.Name = ar.Name
	}
}

// ownedByVM reports whether a VMI was created by a VirtualMachine: its spec
// came from a VM template kvnet already mutated.
func ownedByVM(meta *metav1.ObjectMeta) bool {
	for _, o := range meta.OwnerReferences {
		if o.Kind == chain.KindVM && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}
