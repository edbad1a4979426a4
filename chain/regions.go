package chain

import kubevirtv1 "kubevirt.io/api/core/v1"

// Region is a part of a VM or VMI that mutators may write. The webhook
// copies each before the chain and builds the patch from what changed in
// them: a mutator that writes anywhere else has its change dropped, which
// the contract test in package mutators (TestChangesAreAlwaysRecorded)
// guards against.
type Region struct {
	// Pointer locates the region in the admitted object.
	Pointer string
	// Field points at the region's field in the request's object: a
	// *map[string]string, *[]kubevirtv1.Network, *[]kubevirtv1.Interface,
	// **bool or **kubevirtv1.Memory. (A pointer, not a closure, so listing
	// the regions costs one allocation per request.)
	Field any
}

// Value returns the region's current value.
func (r Region) Value() any {
	switch f := r.Field.(type) {
	case *map[string]string:
		return *f
	case *[]kubevirtv1.Network:
		return *f
	case *[]kubevirtv1.Interface:
		return *f
	case **bool:
		return *f
	case **kubevirtv1.Memory:
		return *f
	}
	return nil
}

// regionPointers are the regions' pointers in a VM and in a VMI, in the
// order Regions lists them (built once: they are the same for every request).
var regionPointers = map[string][8]string{
	KindVM:  pointers("/spec/template/spec", "/spec/template/metadata"),
	KindVMI: pointers("/spec", "/metadata"),
}

func pointers(spec, tmpl string) [8]string {
	return [8]string{"/metadata/annotations", "/metadata/labels", spec + "/networks", spec + "/domain/devices/interfaces",
		spec + "/domain/devices/networkInterfaceMultiqueue", spec + "/domain/memory", tmpl + "/annotations", tmpl + "/labels"}
}

// Regions lists what the VM/VMI mutators may change: the object's and the
// template's annotations and labels, the networks and interfaces, and the
// two domain fields vDPA needs.
func (r *Request) Regions() []Region {
	p := regionPointers[r.Kind]
	d := &r.Spec.Domain
	regions := make([]Region, 0, 8)
	regions = append(regions,
		Region{p[0], &r.Meta.Annotations},
		Region{p[1], &r.Meta.Labels},
		Region{p[2], &r.Spec.Networks},
		Region{p[3], &d.Devices.Interfaces},
		Region{p[4], &d.Devices.NetworkInterfaceMultiQueue},
		Region{p[5], &d.Memory},
	)
	if r.TemplateMeta != r.Meta {
		regions = append(regions, Region{p[6], &r.TemplateMeta.Annotations}, Region{p[7], &r.TemplateMeta.Labels})
	}
	return regions
}
