package webhook

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"sync"
	"unsafe"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/apijson"
)

// The review and the VM and VMI views are read token by token, with a
// switch on each member name, rather than by encoding/json/v2's struct
// decoding: that walks a table of fields by reflection for every member,
// and on a VM's review (a handful of members kvnet keeps, the rest
// skipped) it cost twice what reading the tokens does. The networks and
// interfaces of the shapes most VMs write are scanned too (see scanList);
// a list with any other member, and the rare members (owner references,
// userInfo.extra, memory), are decoded by v2, so a field KubeVirt adds is
// kept.
//
// The decoder is jsontext's, with its defaults: it refuses a duplicate
// member name, invalid UTF-8 and trailing data, as v2 does. The scan is
// strict about the rest too: a member of an unexpected JSON type (a number
// where a name belongs, a list of labels) is an error. Any error sends the
// whole review to the API server's own decoder (see decodeReview), which
// decides what the object means; FuzzDecodersAgree holds the two to the
// same values wherever the scan succeeds.

// errShape is a member of an unexpected JSON type: not a verdict on the
// review, which the API server's decoder then reads.
var errShape = errors.New("a member of an unexpected type")

// scanner reads one JSON text token by token.
type scanner struct {
	dec jsontext.Decoder
	buf bytes.Buffer
	// parts is where the view being scanned takes its parts from.
	parts *viewParts
	// texts is where the view's strings are copied to (see keepText).
	texts []byte
}

// viewParts are the parts of one VM or VMI view, held in the view itself
// (scanned): a view has at most one of each (two metadata), and its
// pointers to them say which members the object has. They belong to the
// view, never to a pooled scanner, and a view is scanned once.
type viewParts struct {
	meta     [2]objectMeta
	metas    int
	spec     vmSpecView
	template vmTemplateView
	vmiSpec  vmiSpecView
	domain   domainView
	devices  devicesView
	// networks and interfaces back the spec's lists: the scan reads a list
	// into them, and where the object has none, the chain request's empty
	// list starts in them (requestParts.spare). Mutators append what they
	// add (the pod network and the networks policy asks for), which
	// otherwise grew a list of 232-byte interfaces on nearly every VM
	// kvnet changes.
	networks   [spareListLen]kubevirtv1.Network
	interfaces [spareListLen]kubevirtv1.Interface
}

// spareListLen is how many networks and interfaces a view holds without
// allocating: a pod network and four more.
const spareListLen = 5

var scanners = sync.Pool{New: func() any { return new(scanner) }}

// release returns s to the pool holding nothing of the request: its buffer
// was the request's body (read in place), which a pooled scanner must not
// keep alive or see again.
func release(s *scanner) {
	s.parts = nil
	s.texts = nil
	s.buf = bytes.Buffer{}
	s.dec.Reset(&s.buf)
	scanners.Put(s)
}

// tokenView is a view that reads itself from the scanner.
type tokenView interface {
	scan(s *scanner) error
}

// scanReview decodes body into rv (whose objects hold body, see
// objectField), all of it: the top-level value and nothing after it.
func scanReview(body []byte, rv *review) error {
	s := scanners.Get().(*scanner)
	defer release(s)
	// A bytes.Buffer is read in place: the decoder's offsets are body's.
	s.buf = *bytes.NewBuffer(body)
	s.dec.Reset(&s.buf)
	err := s.object(func(name []byte) error {
		switch string(name) {
		case "apiVersion":
			return s.word(&rv.APIVersion)
		case "kind":
			return s.word(&rv.Kind)
		case "request":
			if s.dec.PeekKind() == 'n' {
				rv.Request = nil
				return s.null()
			}
			return s.request(rv.Request)
		}
		return s.skip()
	})
	if err != nil {
		return err
	}
	if _, err := s.dec.ReadToken(); err != io.EOF {
		return errors.New("data after the top-level value")
	}
	return nil
}

// request reads the AdmissionRequest, its objects into r's objectFields.
func (s *scanner) request(r *request) error {
	ar := &r.AdmissionRequest
	return s.object(func(name []byte) error {
		switch string(name) {
		case "uid":
			return s.str((*string)(&ar.UID))
		case "kind":
			return s.gvk(&ar.Kind)
		case "resource":
			return s.gvr(&ar.Resource)
		case "subResource":
			return s.word(&ar.SubResource)
		case "requestKind":
			return s.optional(func() error { ar.RequestKind = new(metav1.GroupVersionKind); return s.gvk(ar.RequestKind) }, func() { ar.RequestKind = nil })
		case "requestResource":
			return s.optional(func() error { ar.RequestResource = new(metav1.GroupVersionResource); return s.gvr(ar.RequestResource) }, func() { ar.RequestResource = nil })
		case "requestSubResource":
			return s.word(&ar.RequestSubResource)
		case "name":
			return s.str(&ar.Name)
		case "namespace":
			return s.str(&ar.Namespace)
		case "operation":
			return s.word((*string)(&ar.Operation))
		case "userInfo":
			return s.userInfo(&ar.UserInfo)
		case "object":
			return s.objectField(&r.Object)
		case "oldObject":
			return s.objectField(&r.OldObject)
		case "dryRun":
			return s.optionalBool(&ar.DryRun)
		case "options":
			v, err := s.dec.ReadValue()
			if err != nil {
				return err
			}
			ar.Options.Raw = nil
			if v.Kind() != 'n' {
				ar.Options.Raw = bytes.Clone(v)
			}
			return nil
		}
		return s.skip()
	})
}

func (s *scanner) gvk(k *metav1.GroupVersionKind) error {
	return s.groupVersion(&k.Group, &k.Version, "kind", &k.Kind)
}

func (s *scanner) gvr(r *metav1.GroupVersionResource) error {
	return s.groupVersion(&r.Group, &r.Version, "resource", &r.Resource)
}

// groupVersion reads an object of group, version and a third member,
// last, as a GroupVersionKind or GroupVersionResource has.
func (s *scanner) groupVersion(group, version *string, last string, l *string) error {
	return s.object(func(name []byte) error {
		// Comparisons, not a switch on string(name): with a case that is
		// not a constant, the switch would copy the name.
		switch {
		case string(name) == "group":
			return s.word(group)
		case string(name) == "version":
			return s.word(version)
		case string(name) == last:
			return s.word(l)
		}
		return s.skip()
	})
}

func (s *scanner) userInfo(u *authenticationv1.UserInfo) error {
	return s.object(func(name []byte) error {
		switch string(name) {
		case "username":
			return s.str(&u.Username)
		case "uid":
			return s.str(&u.UID)
		case "groups":
			return s.strings(&u.Groups)
		case "extra":
			return s.v2(&u.Extra)
		}
		return s.skip()
	})
}

// objectField reads one of the review's objects: its bytes (a slice of
// the body, the decoder's offsets giving its place), and its view if it
// has one and the object is a JSON object. A view that does not scan
// itself (the pod's) is decoded by v2 from the same decoder, unless it
// holds an interface (see apijson.DecodesAlike).
func (s *scanner) objectField(o *objectField) error {
	start := valueStart(o.body, s.dec.InputOffset())
	switch v := o.view.(type) {
	case tokenView:
		if s.dec.PeekKind() == '{' {
			if err := v.scan(s); err != nil {
				return err
			}
			o.decoded = true
			break
		}
		if err := s.skip(); err != nil {
			return err
		}
	default:
		if v != nil && s.dec.PeekKind() == '{' && apijson.DecodesAlike(v) {
			if err := s.v2(v); err != nil {
				return err
			}
			o.decoded = true
			break
		}
		if err := s.skip(); err != nil {
			return err
		}
	}
	end := s.dec.InputOffset()
	if start < 0 || end > int64(len(o.body)) || start >= end {
		return errors.New("the object's place in the body is unknown")
	}
	o.raw = o.body[start:end:end]
	if string(o.raw) == "null" {
		o.raw = nil
	}
	return nil
}

// object reads a JSON object, calling member with each member's name (the
// decoder then stands before its value, which member must read), or a
// null, which it leaves to the caller's zero value.
func (s *scanner) object(member func(name []byte) error) error {
	tok, err := s.dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		return nil
	case '{':
	default:
		return errShape
	}
	for s.dec.PeekKind() != '}' {
		name, err := s.name()
		if err != nil {
			return err
		}
		if err := member(name); err != nil {
			return err
		}
	}
	_, err = s.dec.ReadToken()
	return err
}

// optional reads an object into what present makes, or a null by calling
// absent.
func (s *scanner) optional(present func() error, absent func()) error {
	if s.dec.PeekKind() == 'n' {
		absent()
		return s.null()
	}
	return present()
}

// name reads a member name, unescaped only if it has escapes; the bytes
// are valid until the next read.
func (s *scanner) name() ([]byte, error) {
	v, err := s.dec.ReadValue()
	if err != nil {
		return nil, err
	}
	return unquote(v)
}

// unquote is the text of the JSON string v (which the decoder validated).
func unquote(v jsontext.Value) ([]byte, error) {
	if len(v) < 2 || v[0] != '"' {
		return nil, errShape
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1], nil
	}
	return jsontext.AppendUnquote(nil, v)
}

// str reads a string into p; null leaves p as it is, as the API server's
// decoder does.
func (s *scanner) str(p *string) error { return s.readString(p, s.keepText) }

// word reads a string that is most often one of a few words (see
// intern); null leaves p as it is.
func (s *scanner) word(p *string) error { return s.readString(p, intern) }

// keepText copies b out of the body, which is read in place and reused,
// into the view's text: strings are appended to a block, each string a
// slice of it, and a full block is followed by one twice its size. A VM
// review's view holds some fifteen strings of about 300 bytes in all;
// copied one by one they were a tenth of a VM mutation's allocations, now
// two or three. A block is never written again where a string points (it
// is only appended to, and release drops it rather than reusing it), so
// the strings are as immutable as any Go string: the same construction as
// strings.Builder's.
func (s *scanner) keepText(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > cap(s.texts)-len(s.texts) {
		s.texts = make([]byte, 0, max(firstTextBlock, 2*cap(s.texts), len(b)))
	}
	start := len(s.texts)
	s.texts = append(s.texts, b...)
	return unsafe.String(&s.texts[start], len(b))
}

// firstTextBlock is the size of a scan's first block of strings.
const firstTextBlock = 128

// readString reads a string into p as keep makes it from the string's
// bytes (valid until the next read); null leaves p as it is.
func (s *scanner) readString(p *string, keep func([]byte) string) error {
	v, err := s.dec.ReadValue()
	if err != nil {
		return err
	}
	switch v.Kind() {
	case 'n':
		return nil
	case '"':
	default:
		return errShape
	}
	text, err := unquote(v)
	if err != nil {
		return err
	}
	*p = keep(text)
	return nil
}

// intern returns the words every review repeats (its type, the kinds and
// resources kvnet is registered for, the operations, the groups every
// user is in) without allocating them again; any other text is copied.
func intern(b []byte) string {
	switch string(b) {
	case "":
		return ""
	case "admission.k8s.io/v1":
		return "admission.k8s.io/v1"
	case "AdmissionReview":
		return "AdmissionReview"
	case "kubevirt.io":
		return "kubevirt.io"
	case "v1":
		return "v1"
	case "VirtualMachine":
		return "VirtualMachine"
	case "VirtualMachineInstance":
		return "VirtualMachineInstance"
	case "VirtualMachineInstanceMigration":
		return "VirtualMachineInstanceMigration"
	case "virtualmachines":
		return "virtualmachines"
	case "virtualmachineinstances":
		return "virtualmachineinstances"
	case "virtualmachineinstancemigrations":
		return "virtualmachineinstancemigrations"
	case "Pod":
		return "Pod"
	case "pods":
		return "pods"
	case "status":
		return "status"
	case "CREATE":
		return "CREATE"
	case "UPDATE":
		return "UPDATE"
	case "DELETE":
		return "DELETE"
	case "system:authenticated":
		return "system:authenticated"
	case "system:serviceaccounts":
		return "system:serviceaccounts"
	case "system:masters":
		return "system:masters"
	}
	return string(b)
}

// strings reads a list of strings; null is nil, [] an empty list.
func (s *scanner) strings(p *[]string) error {
	tok, err := s.dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		*p = nil
		return nil
	case '[':
	default:
		return errShape
	}
	list := make([]string, 0, 4)
	for s.dec.PeekKind() != ']' {
		if s.dec.PeekKind() != '"' {
			return errShape
		}
		var e string
		if err := s.word(&e); err != nil {
			return err
		}
		list = append(list, e)
	}
	*p = list
	_, err = s.dec.ReadToken()
	return err
}

// stringMap reads an object of strings; null is nil, {} an empty map.
func (s *scanner) stringMap(p *map[string]string) error {
	if s.dec.PeekKind() == 'n' {
		*p = nil
		return s.null()
	}
	m := make(map[string]string)
	*p = m
	return s.object(func(name []byte) error {
		if s.dec.PeekKind() != '"' {
			return errShape
		}
		key := s.keepText(name)
		var v string
		if err := s.str(&v); err != nil {
			return err
		}
		m[key] = v
		return nil
	})
}

// optionalBool reads true, false or null (nil).
func (s *scanner) optionalBool(p **bool) error {
	tok, err := s.dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 'n':
		*p = nil
	case 't', 'f':
		b := tok.Bool()
		*p = &b
	default:
		return errShape
	}
	return nil
}

func (s *scanner) null() error {
	tok, err := s.dec.ReadToken()
	if err == nil && tok.Kind() != 'n' {
		err = errShape
	}
	return err
}

// skip reads past a value kvnet does not keep.
func (s *scanner) skip() error {
	_, err := s.dec.ReadValue()
	return err
}

// v2 decodes the next value into p with encoding/json/v2, for the
// KubeVirt structs kvnet passes on whole and the rare members.
func (s *scanner) v2(p any) error {
	if err := jsonv2.UnmarshalDecode(&s.dec, p); err != nil {
		return fmt.Errorf("decoding %T: %w", p, err)
	}
	return nil
}

// scan implements tokenView.
func (v *vmView) scan(s *scanner) error {
	s.parts = &v.scanned
	return s.object(func(name []byte) error {
		switch string(name) {
		case "metadata":
			return s.meta(&v.Metadata)
		case "spec":
			return s.optional(func() error {
				v.Spec = &s.parts.spec
				return s.object(func(name []byte) error {
					if string(name) != "template" {
						return s.skip()
					}
					return s.optional(func() error {
						t := &s.parts.template
						v.Spec.Template = t
						return s.object(func(name []byte) error {
							switch string(name) {
							case "metadata":
								return s.meta(&t.Metadata)
							case "spec":
								return s.vmiSpec(&t.Spec)
							}
							return s.skip()
						})
					}, func() { v.Spec.Template = nil })
				})
			}, func() { v.Spec = nil })
		}
		return s.skip()
	})
}

// scan implements tokenView.
func (v *vmiView) scan(s *scanner) error {
	s.parts = &v.scanned
	return s.object(func(name []byte) error {
		switch string(name) {
		case "metadata":
			return s.meta(&v.Metadata)
		case "spec":
			return s.vmiSpec(&v.Spec)
		}
		return s.skip()
	})
}

func (s *scanner) meta(p **objectMeta) error {
	return s.optional(func() error {
		if s.parts.metas == len(s.parts.meta) {
			return errShape
		}
		m := &s.parts.meta[s.parts.metas]
		s.parts.metas++
		*p = m
		return s.object(func(name []byte) error {
			switch string(name) {
			case "name":
				return s.str(&m.Name)
			case "generateName":
				return s.str(&m.GenerateName)
			case "namespace":
				return s.str(&m.Namespace)
			case "uid":
				return s.str((*string)(&m.UID))
			case "labels":
				return s.stringMap(&m.Labels)
			case "annotations":
				return s.stringMap(&m.Annotations)
			case "ownerReferences":
				return s.v2(&m.OwnerReferences)
			case "deletionTimestamp":
				return s.v2(&m.DeletionTimestamp)
			}
			return s.skip()
		})
	}, func() { *p = nil })
}

func (s *scanner) vmiSpec(p **vmiSpecView) error {
	return s.optional(func() error {
		spec := &s.parts.vmiSpec
		*p = spec
		return s.object(func(name []byte) error {
			switch string(name) {
			case "networks":
				return scanList(s, &spec.Networks, &spec.whole.networks, (*scanner).network, s.parts.networks[:0])
			case "domain":
				return s.optional(func() error {
					d := &s.parts.domain
					spec.Domain = d
					return s.object(func(name []byte) error {
						switch string(name) {
						case "memory":
							return s.v2(&d.Memory)
						case "devices":
							return s.optional(func() error {
								dev := &s.parts.devices
								d.Devices = dev
								return s.object(func(name []byte) error {
									switch string(name) {
									case "interfaces":
										return scanList(s, &dev.Interfaces, &spec.whole.interfaces, (*scanner).iface, s.parts.interfaces[:0])
									case "networkInterfaceMultiqueue":
										return s.optionalBool(&dev.NetworkInterfaceMultiQueue)
									case "autoattachPodInterface":
										return s.optionalBool(&dev.AutoattachPodInterface)
									}
									return s.skip()
								})
							}, func() { d.Devices = nil })
						}
						return s.skip()
					})
				}, func() { spec.Domain = nil })
			}
			return s.skip()
		})
	}, func() { *p = nil })
}

// scanList reads a list of KubeVirt networks or interfaces: each element
// by elem, which knows the shapes most VMs write ({"name": "default",
// "pod": {}}, an interface's binding, its MAC); a list with any other
// member, or a null, is decoded by v2 instead, so a field of KubeVirt's
// types kvnet does not name is never lost. The list is read whole first,
// so that v2 can start it again. whole reports whether the scan read it
// (every member of every element one the typed element holds). The scan
// appends to backing (see viewParts).
func scanList[T any](s *scanner, p *[]T, whole *bool, elem func(*scanner, *T) error, backing []T) error {
	raw, err := s.dec.ReadValue()
	if err != nil {
		return err
	}
	// raw is the decoder's until its next read: done with before that.
	sub := scanners.Get().(*scanner)
	defer release(sub)
	sub.buf = *bytes.NewBuffer(raw)
	sub.dec.Reset(&sub.buf)
	if list, err := scanElems(sub, elem, backing); err == nil {
		*p, *whole = list, true
		return nil
	}
	*whole = false
	if err := jsonv2.Unmarshal(raw, p); err != nil {
		return fmt.Errorf("decoding %T: %w", p, err)
	}
	return nil
}

func scanElems[T any](s *scanner, elem func(*scanner, *T) error, backing []T) ([]T, error) {
	tok, err := s.dec.ReadToken()
	if err != nil {
		return nil, err
	}
	if tok.Kind() != '[' {
		return nil, errShape
	}
	// Past backing, sized as read, so a mutator adding networks grows it
	// once, to what it needs.
	list := backing
	for s.dec.PeekKind() == '{' {
		list = append(list, *new(T))
		if err := elem(s, &list[len(list)-1]); err != nil {
			return nil, err
		}
	}
	if s.dec.PeekKind() != ']' {
		return nil, errShape
	}
	_, err = s.dec.ReadToken()
	return list, err
}

// network reads a network of the shapes scanList names; any other member
// is errShape, and so is one without the members KubeVirt's type always
// writes (name, a multus source's networkName), or with one it leaves out
// ("default": false): written back, the list would gain or lose them.
func (s *scanner) network(n *kubevirtv1.Network) error {
	var named bool
	err := s.object(func(name []byte) error {
		switch string(name) {
		case "name":
			named = true
			return s.text(&n.Name)
		case "pod":
			n.Pod = &kubevirtv1.PodNetwork{}
			return s.emptyObject()
		case "multus":
			// null is no source to the API server's decoder; here it is
			// not a shape read whole (an object would be written back).
			if s.dec.PeekKind() != '{' {
				return errShape
			}
			m := &kubevirtv1.MultusNetwork{}
			n.Multus = m
			var hasName bool
			err := s.object(func(name []byte) error {
				switch string(name) {
				case "networkName":
					hasName = true
					return s.text(&m.NetworkName)
				case "default":
					// false is what the type leaves out (omitempty).
					if err := s.boolean(&m.Default); err != nil || !m.Default {
						return cmp.Or(err, errShape)
					}
					return nil
				}
				return errShape
			})
			return required(hasName, err)
		}
		return errShape
	})
	return required(named, err)
}

// iface reads an interface of the shapes scanList names; any other member
// is errShape, and so is one without a name, or a binding without one, or
// an empty model or MAC, which the type leaves out (see network).
func (s *scanner) iface(i *kubevirtv1.Interface) error {
	var named bool
	err := s.object(func(name []byte) error {
		switch string(name) {
		case "name":
			named = true
			return s.text(&i.Name)
		case "model":
			return s.nonEmptyText(&i.Model)
		case "macAddress":
			return s.nonEmptyText(&i.MacAddress)
		case "masquerade":
			i.Masquerade = &kubevirtv1.InterfaceMasquerade{}
			return s.emptyObject()
		case "bridge":
			i.Bridge = &kubevirtv1.InterfaceBridge{}
			return s.emptyObject()
		case "sriov":
			i.SRIOV = &kubevirtv1.InterfaceSRIOV{}
			return s.emptyObject()
		case "binding":
			if s.dec.PeekKind() != '{' {
				return errShape
			}
			b := &kubevirtv1.PluginBinding{}
			i.Binding = b
			var hasName bool
			err := s.object(func(name []byte) error {
				if string(name) != "name" {
					return errShape
				}
				hasName = true
				return s.text(&b.Name)
			})
			return required(hasName, err)
		}
		return errShape
	})
	return required(named, err)
}

// nonEmptyText reads a string other than "" into p: "" is what the type
// leaves out (omitempty), so writing it back would drop the member.
func (s *scanner) nonEmptyText(p *string) error {
	if err := s.text(p); err != nil || *p == "" {
		return cmp.Or(err, errShape)
	}
	return nil
}

// required is err, or errShape where a member the type always writes was
// not read.
func required(read bool, err error) error {
	if err == nil && !read {
		return errShape
	}
	return err
}

// text reads a string, and only a string, into p.
func (s *scanner) text(p *string) error {
	if s.dec.PeekKind() != '"' {
		return errShape
	}
	return s.str(p)
}

// boolean reads true or false, and only those, into p.
func (s *scanner) boolean(p *bool) error {
	tok, err := s.dec.ReadToken()
	if err != nil {
		return err
	}
	switch tok.Kind() {
	case 't', 'f':
		*p = tok.Bool()
		return nil
	}
	return errShape
}

// emptyObject reads {}, and only that.
func (s *scanner) emptyObject() error {
	tok, err := s.dec.ReadToken()
	if err != nil {
		return err
	}
	if tok.Kind() != '{' || s.dec.PeekKind() != '}' {
		return errShape
	}
	_, err = s.dec.ReadToken()
	return err
}
