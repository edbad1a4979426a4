package netattach

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kvnet/kvnet/internal/model/dnsname"
)

// Ref names a NetworkAttachmentDefinition as KubeVirt's multus.networkName
// and kvnet's config write it: "namespace/name", or "name" alone for the
// namespace of the object that refers to it. Namespace is empty for the
// short form until In resolves it.
//
// In JSON it is that string. Decoding never fails on the text: a text that
// is no reference decodes to a Ref whose Err says why, so that config
// validation refuses it naming the key and its line (a decoding error
// would name neither).
type Ref struct {
	Namespace, Name string
	// invalid is why the decoded text is no reference ("" for a valid one),
	// and text that text.
	invalid, text string
}

// ParseRef parses "namespace/name" or "name", checking both parts as the
// API server checks a namespace and an object name.
func ParseRef(s string) (Ref, error) {
	ns, name, found := strings.Cut(s, "/")
	if !found {
		ns, name = "", s
	}
	if strings.Contains(name, "/") {
		return Ref{}, fmt.Errorf("want namespace/name or name, got %d slashes", strings.Count(s, "/"))
	}
	// The library checks with regular expressions, which cost more than
	// the rest of an admission's NAD lookup; a valid reference (nearly
	// every one) passes the byte checks below, and only one they refuse
	// goes to the library, for its messages.
	if found && !dnsname.Label(ns) {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			return Ref{}, fmt.Errorf("namespace %q: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if !dnsname.Subdomain(name) {
		if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
			return Ref{}, fmt.Errorf("name %q: %s", name, strings.Join(msgs, "; "))
		}
	}
	return Ref{Namespace: ns, Name: name}, nil
}

// ParseRefIn parses s as ParseRef does and resolves the short form in
// namespace: the NAD a VM's multus.networkName, or a network of
// kvnet.io/networks, attaches in the VM's namespace.
func ParseRefIn(s, namespace string) (Ref, error) {
	r, err := ParseRef(s)
	return r.In(namespace), err
}

// In is r with the short form's namespace resolved to namespace.
func (r Ref) In(namespace string) Ref {
	if r.Namespace == "" {
		r.Namespace = namespace
	}
	return r
}

// String is the text form: "namespace/name", or "name" when unresolved.
func (r Ref) String() string {
	switch {
	case r.invalid != "":
		return r.text
	case r.Namespace == "":
		return r.Name
	}
	return r.Namespace + "/" + r.Name
}

// IsZero reports whether r names nothing (an absent config value).
func (r Ref) IsZero() bool { return r == Ref{} }

// Err says why the text r was decoded from is no reference, or nil.
func (r Ref) Err() error {
	if r.invalid == "" {
		return nil
	}
	return fmt.Errorf("%s", r.invalid)
}

// MarshalText writes the text form; JSON and YAML carry it as a string.
func (r Ref) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads the text form; see Ref for a text that is no
// reference. A text method rather than a JSON one: both JSON decoders
// hand it the string already unquoted, where an UnmarshalJSON had to
// decode the quoted string again (a fifth of parsing kvnet.io/networks).
func (r *Ref) UnmarshalText(b []byte) error {
	*r = RefOf(string(b))
	return nil
}

// RefOf is the Ref s names or, when s names none, a Ref whose Err says why
// and whose String is s: for text validated later, naming its field. The
// empty text is the zero Ref: absent, not wrong.
func RefOf(s string) Ref {
	if s == "" {
		return Ref{}
	}
	r, err := ParseRef(s)
	if err != nil {
		return Ref{invalid: err.Error(), text: s}
	}
	return r
}
