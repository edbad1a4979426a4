package chain

import "strings"

// Kind is a kind of object kvnet admits: a VirtualMachine, whose VMI spec
// and pod metadata are its template's, or a VirtualMachineInstance, which
// the VM chain mutates and validates, or a VirtualMachineInstanceMigration,
// which the migration validators check (it has no members).
// A kind says where each of its members is, in one table of JSON pointers
// (kindLayouts); every other notation (the strict decoder's member paths,
// the regions' pointers) is derived from it.
type Kind string

const (
	KindVM  Kind = "VirtualMachine"
	KindVMI Kind = "VirtualMachineInstance"
)

// Member is one member a mutator writes (a region) or a parent of one.
// The same members exist in every kind, at the kind's pointers.
type Member int

const (
	MemberMeta Member = iota
	MemberAnnotations
	MemberLabels
	// MemberSpec and MemberTemplate are a VM's spec and spec.template; a
	// VMI's spec is its MemberVMISpec, and it has no template.
	MemberSpec
	MemberTemplate
	// The template's metadata: a VMI's own.
	MemberTemplateMeta
	MemberTemplateAnnotations
	MemberTemplateLabels
	// The VMI spec: a VM's spec.template.spec, a VMI's spec.
	MemberVMISpec
	MemberNetworks
	MemberDomain
	MemberMemory
	MemberDevices
	MemberInterfaces
	MemberMultiqueue
	numMembers
)

// layout is where a kind keeps the metadata and spec a VMI has.
type layout struct {
	templateMeta, vmiSpec string
	// spec and template are a VM's parents of the VMI spec ("" for a VMI).
	spec, template string
}

var kindLayouts = map[Kind]layout{
	KindVM:  {templateMeta: "/spec/template/metadata", vmiSpec: "/spec/template/spec", spec: "/spec", template: "/spec/template"},
	KindVMI: {templateMeta: "/metadata", vmiSpec: "/spec"},
}

// members are each kind's pointers, by Member, and the other way round.
var members = func() map[Kind]*memberTable {
	out := map[Kind]*memberTable{}
	for k, l := range kindLayouts {
		t := &memberTable{byPointer: map[string]Member{}}
		t.pointer = [numMembers]string{
			MemberMeta: "/metadata", MemberAnnotations: "/metadata/annotations", MemberLabels: "/metadata/labels",
			MemberSpec: l.spec, MemberTemplate: l.template,
			MemberTemplateMeta: l.templateMeta, MemberTemplateAnnotations: l.templateMeta + "/annotations", MemberTemplateLabels: l.templateMeta + "/labels",
			MemberVMISpec: l.vmiSpec, MemberNetworks: l.vmiSpec + "/networks", MemberDomain: l.vmiSpec + "/domain",
			MemberMemory: l.vmiSpec + "/domain/memory", MemberDevices: l.vmiSpec + "/domain/devices",
			MemberInterfaces: l.vmiSpec + "/domain/devices/interfaces", MemberMultiqueue: l.vmiSpec + "/domain/devices/networkInterfaceMultiqueue",
		}
		// A VMI's template members are its own: the first name wins.
		for m := numMembers - 1; m >= 0; m-- {
			if p := t.pointer[m]; p != "" {
				t.byPointer[p] = m
			}
		}
		out[k] = t
	}
	return out
}()

type memberTable struct {
	pointer   [numMembers]string
	byPointer map[string]Member
}

// Pointer is where m is in an object of kind k ("" for a member the kind
// does not have).
func (k Kind) Pointer(m Member) string {
	if t := members[k]; t != nil {
		return t.pointer[m]
	}
	return ""
}

// MemberAt is the member at pointer in an object of kind k.
func (k Kind) MemberAt(pointer string) (Member, bool) {
	t := members[k]
	if t == nil {
		return 0, false
	}
	m, ok := t.byPointer[pointer]
	return m, ok
}

// MemberPaths are every kind's members in the strict decoder's notation
// ("spec.template.metadata.annotations"): the fields whose duplicates a
// patch cannot address.
func MemberPaths() map[string]bool {
	out := map[string]bool{}
	for _, t := range members {
		for _, p := range t.pointer {
			if p != "" {
				out[strings.ReplaceAll(p[1:], "/", ".")] = true
			}
		}
	}
	return out
}

// Members is a set of members: the ones an admitted object has.
type Members uint32

// Add adds m to the set.
func (s *Members) Add(m Member) { *s |= 1 << m }

// Has reports whether m is in the set.
func (s Members) Has(m Member) bool { return s&(1<<m) != 0 }
