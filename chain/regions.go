package chain

// Region is a part of a VM or VMI that mutators may write. The webhook
// copies each before the chain and builds the patch from what changed in
// them: a mutator that writes anywhere else has its change dropped, which
// the contract test in package mutators (TestChangesAreAlwaysRecorded)
// guards against.
type Region struct {
	// Pointer locates the region in the admitted object.
	Pointer string
	// Value returns the region's current value.
	Value func() any
}

// Regions lists what the VM/VMI mutators may change: the object's and the
// template's annotations and labels, the networks and interfaces, and the
// two domain fields vDPA needs.
func (r *Request) Regions() []Region {
	spec, tmpl := "/spec", "/metadata"
	if r.Kind == KindVM {
		spec, tmpl = "/spec/template/spec", "/spec/template/metadata"
	}
	regions := []Region{
		{"/metadata/annotations", func() any { return r.Meta.Annotations }},
		{"/metadata/labels", func() any { return r.Meta.Labels }},
		{spec + "/networks", func() any { return r.Spec.Networks }},
		{spec + "/domain/devices/interfaces", func() any { return r.Spec.Domain.Devices.Interfaces }},
		{spec + "/domain/devices/networkInterfaceMultiqueue", func() any { return r.Spec.Domain.Devices.NetworkInterfaceMultiQueue }},
		{spec + "/domain/memory", func() any { return r.Spec.Domain.Memory }},
	}
	if r.TemplateMeta != r.Meta {
		regions = append(regions,
			Region{tmpl + "/annotations", func() any { return r.TemplateMeta.Annotations }},
			Region{tmpl + "/labels", func() any { return r.TemplateMeta.Labels }},
		)
	}
	return regions
}
