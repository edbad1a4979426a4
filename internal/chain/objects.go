package chain

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// The field paths of a VM's and a VMI's spec and template metadata, built
// once: a field.Path never changes (Child and Index return new ones).
var (
	vmSpecPath          = field.NewPath("spec", "template", "spec")
	vmTemplateMetaPath  = field.NewPath("spec", "template", "metadata")
	vmiSpecPath         = field.NewPath("spec")
	vmiTemplateMetaPath = field.NewPath("metadata")
)

// ForVM builds a request whose pointers alias into vm, so mutators change
// the VM itself: the VMI spec is spec.template.spec, and annotations meant
// for the VMI and its pod go on spec.template.metadata. A VM without a
// template gets an empty one.
func ForVM(vm *kubevirtv1.VirtualMachine) *Request {
	if vm.Spec.Template == nil {
		vm.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{}
	}
	r := new(Request)
	InitVM(r, &vm.ObjectMeta, vm.Spec.Template)
	return r
}

// InitVM makes r the request of a VM with metadata meta and template t,
// held apart from a VirtualMachine: the webhook decodes only these, and
// allocates them with the request in one piece.
func InitVM(r *Request, meta *metav1.ObjectMeta, t *kubevirtv1.VirtualMachineInstanceTemplateSpec) {
	*r = Request{
		Kind:             KindVM,
		Name:             meta.Name,
		Namespace:        meta.Namespace,
		Meta:             meta,
		TemplateMeta:     &t.ObjectMeta,
		Spec:             &t.Spec,
		SpecPath:         vmSpecPath,
		TemplateMetaPath: vmTemplateMetaPath,
	}
}

// ForVMI builds a request whose pointers alias into vmi; its own metadata
// is also where annotations for its pod go.
func ForVMI(vmi *kubevirtv1.VirtualMachineInstance) *Request {
	r := new(Request)
	InitVMI(r, &vmi.ObjectMeta, &vmi.Spec)
	return r
}

// InitVMI makes r the request of a VMI with metadata meta and spec spec
// (see InitVM).
func InitVMI(r *Request, meta *metav1.ObjectMeta, spec *kubevirtv1.VirtualMachineInstanceSpec) {
	*r = Request{
		Kind:             KindVMI,
		Name:             meta.Name,
		Namespace:        meta.Namespace,
		Meta:             meta,
		TemplateMeta:     meta,
		Spec:             spec,
		SpecPath:         vmiSpecPath,
		TemplateMetaPath: vmiTemplateMetaPath,
	}
}
