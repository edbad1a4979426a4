package chain

import (
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
	return &Request{
		Kind:             KindVM,
		Name:             vm.Name,
		Namespace:        vm.Namespace,
		Meta:             &vm.ObjectMeta,
		TemplateMeta:     &vm.Spec.Template.ObjectMeta,
		Spec:             &vm.Spec.Template.Spec,
		SpecPath:         vmSpecPath,
		TemplateMetaPath: vmTemplateMetaPath,
	}
}

// ForVMI builds a request whose pointers alias into vmi; its own metadata
// is also where annotations for its pod go.
func ForVMI(vmi *kubevirtv1.VirtualMachineInstance) *Request {
	return &Request{
		Kind:             KindVMI,
		Name:             vmi.Name,
		Namespace:        vmi.Namespace,
		Meta:             &vmi.ObjectMeta,
		TemplateMeta:     &vmi.ObjectMeta,
		Spec:             &vmi.Spec,
		SpecPath:         vmiSpecPath,
		TemplateMetaPath: vmiTemplateMetaPath,
	}
}
