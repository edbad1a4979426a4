package chain

import kubevirtv1 "kubevirt.io/api/core/v1"

// Region is one part of a VM or VMI that mutators may write: Field points
// at it in the request's typed object, Pointer locates it in the admitted
// JSON.
type Region[T any] struct {
	Pointer string
	Field   *T
}

// Regions are the parts of a VM or VMI that mutators may write. The webhook
// copies each before the chain and builds the patch from what changed in
// them: a mutator that writes anywhere else has its change dropped, which
// the contract test in package mutators (TestChangesAreAlwaysRecorded)
// guards against. Each has its own type, so the webhook copies and diffs
// each with code for that type. A new region needs that code in
// webhook/vmpatch.go and its pointer in Pointers: TestEveryRegionIsPatched
// (webhook) and TestPointersNameEveryRegion fail until both are there.
type Regions struct {
	// Maps are the object's annotations and labels, then, on a VM, its
	// template's (a VMI's template metadata is its own).
	Maps       []Region[map[string]string]
	Networks   Region[[]kubevirtv1.Network]
	Interfaces Region[[]kubevirtv1.Interface]
	Multiqueue Region[*bool]
	Memory     Region[*kubevirtv1.Memory]
}

// Regions lists what the VM/VMI mutators may change: the object's and the
// template's annotations and labels, the networks and interfaces, and the
// two domain fields vDPA needs.
func (r *Request) Regions() Regions {
	p := &members[r.Kind].pointer
	d := &r.Spec.Domain
	maps := make([]Region[map[string]string], 2, 4)
	maps[0] = Region[map[string]string]{p[MemberAnnotations], &r.Meta.Annotations}
	maps[1] = Region[map[string]string]{p[MemberLabels], &r.Meta.Labels}
	if r.TemplateMeta != r.Meta {
		maps = append(maps, Region[map[string]string]{p[MemberTemplateAnnotations], &r.TemplateMeta.Annotations}, Region[map[string]string]{p[MemberTemplateLabels], &r.TemplateMeta.Labels})
	}
	return Regions{
		Maps:       maps,
		Networks:   Region[[]kubevirtv1.Network]{p[MemberNetworks], &r.Spec.Networks},
		Interfaces: Region[[]kubevirtv1.Interface]{p[MemberInterfaces], &d.Devices.Interfaces},
		Multiqueue: Region[*bool]{p[MemberMultiqueue], &d.Devices.NetworkInterfaceMultiQueue},
		Memory:     Region[*kubevirtv1.Memory]{p[MemberMemory], &d.Memory},
	}
}

// Pointers lists every region's pointer.
func (rs Regions) Pointers() []string {
	out := make([]string, 0, len(rs.Maps)+4)
	for _, m := range rs.Maps {
		out = append(out, m.Pointer)
	}
	return append(out, rs.Networks.Pointer, rs.Interfaces.Pointer, rs.Multiqueue.Pointer, rs.Memory.Pointer)
}
