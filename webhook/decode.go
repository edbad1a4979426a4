package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/owner"
)

// decodeVMOrVMI decodes the part of a VM or VMI the chain reads (see vmView)
// into a typed object and returns a chain request whose pointers alias into
// it, so mutators change the object itself, and the shape of the admitted
// object: which of the members mutators write (and their parents) it has.
// patching asks for the duplicates the patch cannot address (see
// unmarshalNoting); a validator, which writes no patch, does not pay for
// looking.
func decodeVMOrVMI(kind chain.Kind, raw []byte, patching bool, view any) (*chain.Request, *vmShape, error) {
	var members map[string]bool
	if patching {
		members = patchMembers
	}
	if len(raw) == 0 {
		return nil, nil, fmt.Errorf("the request carries no object")
	}
	// json.Unmarshal takes null for an empty object; the patch for it
	// would then not apply to the request's object.
	if !apijson.IsObject(raw) {
		return nil, nil, fmt.Errorf("the request's object is not a JSON object")
	}
	views, ok := kindViews[kind]
	if !ok {
		return nil, nil, fmt.Errorf("kvnet does not handle kind %q", kind)
	}
	// A view the Edge decoded came from v2, which refuses any duplicate
	// name, so there is none to report.
	v, decoded := view.(kindView)
	var dups *duplicateMember
	if !decoded {
		// Nobody gives this one back (a handler called without the
		// Edge): the collector takes it.
		v = views.Get().(kindView)
		var err error
		if dups, err = unmarshalNoting(raw, v, members); err != nil {
			return nil, nil, fmt.Errorf("decoding %s: %w", kind, err)
		}
	}
	req, shape := v.request()
	shape.kind, shape.duplicate = kind, dups
	return req, shape, nil
}

// kindView is a kind's view: the part of its objects kvnet decodes, which
// becomes the chain's request and tells the object's shape.
type kindView interface {
	request() (*chain.Request, *vmShape)
}

// kindViews hold each kind's empty views.
var kindViews = map[chain.Kind]*sync.Pool{chain.KindVM: &vmViews, chain.KindVMI: &vmiViews}

// vmViews and vmiViews keep the views the Edge decodes into from one request
// to the next. A view holds the parts its scan fills, with room for the
// network and interface lists (viewParts), and the chain request with the
// typed objects it aliases (requestParts): 5-7 KB that were garbage the
// moment the answer was written, at thousands of requests a second a
// third of what a VM's admission allocated, and what a collection is paid
// for (docs/performance.md). The Edge gives a view back (releaseVMView)
// only after its answer is written; nothing kvnet keeps past the answer
// points into a view (TestPooledViewsComeBackEmpty,
// TestEdgeAnswersAsTheHandler, TestConcurrentAnswersAreTheirOwn).
var (
	vmViews  = sync.Pool{New: func() any { return new(vmView) }}
	vmiViews = sync.Pool{New: func() any { return new(vmiView) }}
)

// newVMView returns an empty view of kind's objects for the Edge to decode
// (see viewHandler), or nil for a kind kvnet does not handle.
func newVMView(kind chain.Kind) any {
	if views, ok := kindViews[kind]; ok {
		return views.Get()
	}
	return nil
}

// releaseVMView empties a view newVMView returned and keeps it for another
// request. Emptied, it points at nothing of the request it served.
func releaseVMView(view any) {
	switch v := view.(type) {
	case *vmView:
		*v = vmView{}
		vmViews.Put(v)
	case *vmiView:
		*v = vmiView{}
		vmiViews.Put(v)
	}
}

// requestParts are a chain request and the objects its pointers alias,
// part of the view they are made from, so one piece with it.
type requestParts struct {
	req      chain.Request
	shape    vmShape
	meta     metav1.ObjectMeta
	template kubevirtv1.VirtualMachineInstanceTemplateSpec
	// changes backs the request's record of what mutators did: one entry
	// per mutator and rule, six for a VM gaining networks by rule and
	// annotation, vDPA and kube-ovn.
	changes [6]chain.Change
}

// spare gives the spec's empty lists the view's room (viewParts). An
// empty list stays empty, so the chain sees what the object has; the patch
// is made from the object's shape (vmShape), not from whether a list is
// nil.
func spare(s *kubevirtv1.VirtualMachineInstanceSpec, room *viewParts) {
	if len(s.Networks) == 0 {
		s.Networks = room.networks[:0]
	}
	if d := &s.Domain.Devices; len(d.Interfaces) == 0 {
		d.Interfaces = room.interfaces[:0]
	}
}

func (v *vmView) request() (*chain.Request, *vmShape) {
	p := &v.parts
	p.meta = v.Metadata.objectMeta()
	shape := &p.shape
	v.Metadata.shape(&shape.members, chain.MemberMeta, chain.MemberAnnotations, chain.MemberLabels)
	if s := v.Spec; s != nil {
		shape.members.Add(chain.MemberSpec)
		if t := s.Template; t != nil {
			shape.members.Add(chain.MemberTemplate)
			t.Metadata.shape(&shape.members, chain.MemberTemplateMeta, chain.MemberTemplateAnnotations, chain.MemberTemplateLabels)
			t.Spec.shape(&shape.members)
			if t.Spec != nil {
				shape.whole = t.Spec.whole
			}
			p.template = kubevirtv1.VirtualMachineInstanceTemplateSpec{ObjectMeta: t.Metadata.objectMeta(), Spec: t.Spec.spec()}
		}
	}
	spare(&p.template.Spec, &v.scanned)
	chain.InitVM(&p.req, &p.meta, &p.template)
	p.req.Changes = p.changes[:0]
	return &p.req, shape
}

func (v *vmiView) request() (*chain.Request, *vmShape) {
	p := &v.parts
	p.meta = v.Metadata.objectMeta()
	p.template.Spec = v.Spec.spec()
	spare(&p.template.Spec, &v.scanned)
	shape := &p.shape
	v.Metadata.shape(&shape.members, chain.MemberMeta, chain.MemberAnnotations, chain.MemberLabels)
	v.Spec.shape(&shape.members)
	if v.Spec != nil {
		shape.whole = v.Spec.whole
	}
	chain.InitVMI(&p.req, &p.meta, &p.template.Spec)
	p.req.Changes = p.changes[:0]
	return &p.req, shape
}

// decodeView returns view if the Edge decoded the object into it, and
// otherwise decodes raw, noting duplicates of members (nil: none looked
// for, see unmarshalNoting). A view the Edge decoded came from v2, which
// refuses any duplicate name, so there is none to report.
func decodeView[V any](raw []byte, members map[string]bool, view any) (*V, *duplicateMember, error) {
	if v, ok := view.(*V); ok && v != nil {
		return v, nil, nil
	}
	v := new(V)
	dups, err := unmarshalNoting(raw, v, members)
	return v, dups, err
}

// duplicateMember is a member a patch relies on that the object gives
// twice: not a decoding failure (the decode merged both copies), but a
// reason to refuse the request if it needs a patch. The decoder's message
// names the field.
type duplicateMember apijson.Duplicate

// refusal is the 400 a request with d is answered with when it needs a
// patch.
func (d *duplicateMember) refusal() admission.Response {
	return admission.Errored(http.StatusBadRequest, errors.New(d.Message))
}

// unmarshalNoting decodes raw into v as apijson.Unmarshal does and returns
// the first duplicate of one of members, the members a patch relies on (a
// region or a parent of one: patchMembers for VMs and VMIs,
// podPatchMembers for pods). The view merges both copies, so the patch
// could address a member the last copy, the one a JSON patch applies to,
// lacks. The API server decodes and re-encodes the objects it sends, so
// only a hand-written object has one, and it is refused only when there
// is a patch (see VMMutator and PodMutator). A handler that writes no
// patch passes nil members and does not pay for looking.
func unmarshalNoting(raw []byte, v any, members map[string]bool) (*duplicateMember, error) {
	if members == nil {
		return nil, apijson.Unmarshal(raw, v)
	}
	dups, err := apijson.UnmarshalStrict(raw, v)
	if err != nil {
		return nil, err
	}
	for _, d := range dups {
		if members[withoutIndexes(d.Path)] {
			return (*duplicateMember)(&d), nil
		}
	}
	return nil, nil
}

// withoutIndexes turns the strict decoder's list indexes into "[]"
// ("spec.containers[2].resources" becomes "spec.containers[].resources"),
// so one entry of a members map stands for every element of a list.
func withoutIndexes(path string) string {
	if !strings.Contains(path, "[") {
		return path
	}
	var b strings.Builder
	b.Grow(len(path))
	for i := 0; i < len(path); i++ {
		b.WriteByte(path[i])
		if path[i] != '[' {
			continue
		}
		j := i + 1
		for j < len(path) && path[j] >= '0' && path[j] <= '9' {
			j++
		}
		if j > i+1 && j < len(path) && path[j] == ']' {
			i = j - 1
		}
	}
	return b.String()
}

// patchMembers are the field paths, in the strict decoder's notation, of
// the members the VM and VMI patches address, and of their parents.
var patchMembers = chain.MemberPaths()

// vmView and vmiView are the parts of a VM and a VMI that kvnet's mutators
// and validators read (chain.Request documents them): metadata without
// managedFields, and of the VMI spec only the networks, the interfaces and
// the two domain fields vDPA needs. Disks, volumes, cloud-init and status
// are never decoded; they stay in the request's object, which the patch
// (built from the members mutators write, see vmPatch) leaves alone.
// Decoding into the full KubeVirt types cost more than everything else the
// webhook does: VirtualMachineInstanceSpec alone decodes itself twice.
// Parents are pointers, so the decode also tells which ones the object has.
type vmView struct {
	Metadata *objectMeta `json:"metadata"`
	Spec     *vmSpecView `json:"spec"`

	scanned viewParts
	parts   requestParts
}

type vmSpecView struct {
	Template *vmTemplateView `json:"template"`
}

type vmTemplateView struct {
	Metadata *objectMeta  `json:"metadata"`
	Spec     *vmiSpecView `json:"spec"`
}

type vmiView struct {
	Metadata *objectMeta  `json:"metadata"`
	Spec     *vmiSpecView `json:"spec"`

	scanned viewParts
	parts   requestParts
}

type vmiSpecView struct {
	Domain   *domainView          `json:"domain"`
	Networks []kubevirtv1.Network `json:"networks"`

	// whole says which lists the scan read whole: every member of every
	// element is one the typed element holds (see scanList), so the list
	// can be written back whole without losing a field.
	whole wholeLists
}

// wholeLists names the lists of a VMI spec read whole.
type wholeLists struct{ networks, interfaces bool }

type domainView struct {
	Devices *devicesView       `json:"devices"`
	Memory  *kubevirtv1.Memory `json:"memory"`
}

type devicesView struct {
	Interfaces                 []kubevirtv1.Interface `json:"interfaces"`
	NetworkInterfaceMultiQueue *bool                  `json:"networkInterfaceMultiqueue"`
	AutoattachPodInterface     *bool                  `json:"autoattachPodInterface"`
}

func (v *vmiSpecView) spec() kubevirtv1.VirtualMachineInstanceSpec {
	var s kubevirtv1.VirtualMachineInstanceSpec
	if v == nil {
		return s
	}
	s.Networks = v.Networks
	if v.Domain == nil {
		return s
	}
	s.Domain.Memory = v.Domain.Memory
	if d := v.Domain.Devices; d != nil {
		s.Domain.Devices.Interfaces, s.Domain.Devices.NetworkInterfaceMultiQueue, s.Domain.Devices.AutoattachPodInterface = d.Interfaces, d.NetworkInterfaceMultiQueue, d.AutoattachPodInterface
	}
	return s
}

// shape adds to s the members of the VMI spec the object has.
func (v *vmiSpecView) shape(s *chain.Members) {
	if v == nil {
		return
	}
	s.Add(chain.MemberVMISpec)
	if v.Networks != nil {
		s.Add(chain.MemberNetworks)
	}
	if v.Domain == nil {
		return
	}
	s.Add(chain.MemberDomain)
	if v.Domain.Memory != nil {
		s.Add(chain.MemberMemory)
	}
	if d := v.Domain.Devices; d != nil {
		s.Add(chain.MemberDevices)
		if d.Interfaces != nil {
			s.Add(chain.MemberInterfaces)
		}
		if d.NetworkInterfaceMultiQueue != nil {
			s.Add(chain.MemberMultiqueue)
		}
	}
}

// vmShape says which members the mutators write, and which of their
// parents, the admitted object has (present and not null): the patch adds a
// member whole where the object lacks it, and under the first missing
// parent where that is missing too.
type vmShape struct {
	kind    chain.Kind
	members chain.Members
	// duplicate names a member above that the object gives twice, if any
	// (see unmarshalNoting).
	duplicate *duplicateMember
	// whole says which lists were read whole (see vmiSpecView.whole).
	whole wholeLists
}

// has reports whether the admitted object has the member at pointer, one of
// the regions chain.Request.Regions names or a parent of one.
func (s *vmShape) has(pointer string) bool {
	m, ok := s.kind.MemberAt(pointer)
	return ok && s.members.Has(m)
}

// missing returns the first parent of pointer the admitted object lacks,
// or "" when pointer's parent exists.
func (s *vmShape) missing(pointer string) string {
	for i := 1; i < len(pointer); i++ {
		if pointer[i] == '/' && !s.has(pointer[:i]) {
			return pointer[:i]
		}
	}
	return ""
}

// objectMeta is metav1.ObjectMeta without managedFields (often the larger
// part of an object's metadata) and the fields kvnet never reads.
type objectMeta struct {
	Name              string                  `json:"name"`
	GenerateName      string                  `json:"generateName"`
	Namespace         string                  `json:"namespace"`
	UID               types.UID               `json:"uid"`
	Labels            map[string]string       `json:"labels"`
	Annotations       map[string]string       `json:"annotations"`
	OwnerReferences   []metav1.OwnerReference `json:"ownerReferences"`
	DeletionTimestamp *metav1.Time            `json:"deletionTimestamp"`
}

// shape adds to s the metadata members the object has: meta, and its
// annotations and labels when not null.
func (m *objectMeta) shape(s *chain.Members, meta, annotations, labels chain.Member) {
	if m == nil {
		return
	}
	s.Add(meta)
	if m.Annotations != nil {
		s.Add(annotations)
	}
	if m.Labels != nil {
		s.Add(labels)
	}
}

func (m *objectMeta) objectMeta() metav1.ObjectMeta {
	if m == nil {
		return metav1.ObjectMeta{}
	}
	return metav1.ObjectMeta{
		Name: m.Name, GenerateName: m.GenerateName, Namespace: m.Namespace, UID: m.UID,
		Labels: m.Labels, Annotations: m.Annotations, OwnerReferences: m.OwnerReferences,
		DeletionTimestamp: m.DeletionTimestamp,
	}
}

// fillRequest completes a decoded request with what the AdmissionReview says.
// The object's own namespace is empty on CREATE with generateName or when
// the client left it out; the review's namespace is authoritative.
func fillRequest(cr *chain.Request, ar *admissionv1.AdmissionRequest) {
	cr.Operation, cr.Review = ar.Operation, ar
	if ar.Namespace != "" {
		cr.Namespace = ar.Namespace
	}
	if cr.Name == "" {
		cr.Name = ar.Name
	}
}

// chainRequest turns a VM or VMI admission into the chain's request, or
// returns the answer for one kvnet leaves alone: an operation other than
// CREATE and UPDATE, an object it cannot read (400), one chain.SkipReason
// names, or a VMI a VM controls. Such a VMI's spec is the VM's template,
// which kvnet mutated and validated on the VM's own CREATE and UPDATE (or
// which the VM opted out of with kvnet.io/skip, an annotation KubeVirt does
// not copy to the VMI): acting on it again would override that choice, and
// a refusal would only show as virt-controller retrying a VM that looks
// admitted.
func chainRequest(ctx context.Context, kind chain.Kind, req *admission.Request, cfg *config.Source, facts lookup.Facts, patching bool, view any) (*chain.Request, *vmShape, *admission.Response) {
	answer := func(r admission.Response) (*chain.Request, *vmShape, *admission.Response) { return nil, nil, &r }
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return answer(admission.Allowed(""))
	}
	cr, shape, err := decodeVMOrVMI(kind, req.Object.Raw, patching, view)
	if err != nil {
		return answer(admission.Errored(http.StatusBadRequest, err))
	}
	fillRequest(cr, &req.AdmissionRequest)
	cr.Config, cr.Facts = cfg.Get(), facts
	if reason := chain.SkipReason(cr); reason != "" {
		logf.FromContext(ctx).V(1).Info("skipped", "reason", reason)
		return answer(admission.Allowed(reason))
	}
	if kind == chain.KindVMI && owner.ControllingVM(cr.Meta) != nil {
		return answer(admission.Allowed("spec comes from a VirtualMachine kvnet already admitted"))
	}
	return cr, shape, nil
}
