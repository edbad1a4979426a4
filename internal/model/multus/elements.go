// Package multus reads and rewrites the k8s.v1.cni.cncf.io/networks pod
// annotation without losing anything it does not understand. The upstream
// NetworkSelectionElement struct has no catch-all field, so a round trip
// through it drops custom keys (and the order of keys); kvnet keeps each
// element as its raw key/value pairs instead and only touches the keys it sets.
package multus

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// NetworksAnnotation is the Multus network selection annotation on pods.
const NetworksAnnotation = "k8s.v1.cni.cncf.io/networks"

// Well-known element keys (multi-net spec v1.3).
const (
	KeyName               = "name"
	KeyNamespace          = "namespace"
	KeyInterface          = "interface"
	KeyIPs                = "ips"
	KeyMAC                = "mac"
	KeyDefaultRoute       = "default-route"
	KeyIPAMClaimReference = "ipam-claim-reference"
)

// Element is one network selection element. Keys keep their original order
// and raw JSON values, so printing an element that was not changed gives back
// the same JSON.
type Element struct {
	keys []string
	raw  map[string]json.RawMessage
}

// NewElement starts an element for namespace/name.
func NewElement(namespace, name string) *Element {
	e := &Element{raw: map[string]json.RawMessage{}}
	e.SetString(KeyName, name)
	if namespace != "" {
		e.SetString(KeyNamespace, namespace)
	}
	return e
}

// String returns the value of a string key, or "".
func (e *Element) String(key string) string {
	v, ok := e.raw[key]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}

// OptionalString returns the value of a string key that may be left
// out: "" with ok when the key is absent or null, as Multus reads both,
// and ok false when its value is not a string, which Multus refuses.
func (e *Element) OptionalString(key string) (s string, ok bool) {
	v, present := e.raw[key]
	if !present {
		return "", true
	}
	return s, json.Unmarshal(v, &s) == nil
}

// Name is the NAD name.
func (e *Element) Name() string { return e.String(KeyName) }

// Namespace is the NAD namespace; "" means the pod's.
func (e *Element) Namespace() string { return e.String(KeyNamespace) }

// Interface is the requested pod interface name.
func (e *Element) Interface() string { return e.String(KeyInterface) }

// Has reports whether the key is present.
func (e *Element) Has(key string) bool { _, ok := e.raw[key]; return ok }

// Raw returns the raw JSON of a key.
func (e *Element) Raw(key string) json.RawMessage { return e.raw[key] }

// Keys returns the keys in order.
func (e *Element) Keys() []string { return append([]string(nil), e.keys...) }

// Set stores v under key, keeping the key's position if it exists.
func (e *Element) Set(key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", key, err)
	}
	if _, ok := e.raw[key]; !ok {
		e.keys = append(e.keys, key)
	}
	e.raw[key] = b
	return nil
}

// SetString stores a string value.
func (e *Element) SetString(key, v string) { _ = e.Set(key, v) }

// Delete removes a key.
func (e *Element) Delete(key string) {
	if _, ok := e.raw[key]; !ok {
		return
	}
	delete(e.raw, key)
	for i, k := range e.keys {
		if k == key {
			e.keys = append(e.keys[:i], e.keys[i+1:]...)
			break
		}
	}
}

// Refers reports whether the element selects NAD namespace/name, taking an
// empty namespace as podNamespace.
func (e *Element) Refers(podNamespace, namespace, name string) bool {
	ns := e.Namespace()
	if ns == "" {
		ns = podNamespace
	}
	return ns == namespace && e.Name() == name
}

// MarshalJSON writes the keys in their original order.
func (e *Element) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range e.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(e.raw[k])
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads an object, remembering key order.
func (e *Element) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("want a JSON object, got %v", tok)
	}
	e.keys, e.raw = nil, map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("value of %q: %w", key, err)
		}
		if _, dup := e.raw[key]; dup {
			return fmt.Errorf("key %q appears twice", key)
		}
		e.keys = append(e.keys, key)
		e.raw[key] = v
	}
	_, err = dec.Token()
	return err
}

// Parse reads the annotation in either of its forms: a JSON list of elements
// or the comma-separated short form "ns/name@ifname, name2". Errors say which
// element is wrong and why.
func Parse(annotation string) ([]*Element, error) {
	return parse(NetworksAnnotation, annotation, true)
}

// DefaultNetworkAnnotation is Multus' choice of a pod's default network, in
// the same forms as NetworksAnnotation.
const DefaultNetworkAnnotation = "v1.multus-cni.io/default-network"

// ParseDefaultNetwork reads the default-network annotation. Unlike a
// secondary network's element, its element may carry "ips" together with
// "ipam-claim-reference": OVN-Kubernetes takes both from it for a primary
// user-defined network (it records the requested IPs in the claim).
func ParseDefaultNetwork(annotation string) ([]*Element, error) {
	return parse(DefaultNetworkAnnotation, annotation, false)
}

func parse(what, annotation string, secondary bool) ([]*Element, error) {
	s := strings.TrimSpace(annotation)
	if s == "" {
		return nil, nil
	}
	if strings.HasPrefix(s, "[") || strings.HasPrefix(s, "{") {
		var elems []*Element
		if err := json.Unmarshal([]byte(s), &elems); err != nil {
			return nil, fmt.Errorf("%s is not a valid JSON list of network selection elements: %w", what, err)
		}
		for i, e := range elems {
			if e == nil {
				return nil, fmt.Errorf("%s element %d: null is not a network selection element", what, i)
			}
			if e.Name() == "" {
				return nil, fmt.Errorf("%s element %d: \"name\" is required and must be a string", what, i)
			}
			if secondary && e.Has(KeyIPs) && e.Has(KeyIPAMClaimReference) {
				return nil, fmt.Errorf("%s element %d (%s): \"ips\" and \"ipam-claim-reference\" cannot be used together", what, i, e.Name())
			}
		}
		return elems, nil
	}
	var elems []*Element
	for i, item := range strings.Split(s, ",") {
		ns, name, iface, err := ParseShort(item)
		if err != nil {
			return nil, fmt.Errorf("%s element %d: %w", what, i, err)
		}
		e := NewElement(ns, name)
		if iface != "" {
			e.SetString(KeyInterface, iface)
		}
		elems = append(elems, e)
	}
	return elems, nil
}

// ParseShort splits one short-form item "ns/name@ifname".
func ParseShort(item string) (namespace, name, iface string, err error) {
	item = strings.TrimSpace(item)
	if item == "" {
		return "", "", "", fmt.Errorf("empty item")
	}
	rest, iface, _ := strings.Cut(item, "@")
	namespace, name, found := strings.Cut(rest, "/")
	if !found {
		namespace, name = "", rest
	}
	switch {
	case name == "":
		return "", "", "", fmt.Errorf("%q has no network name", item)
	case strings.ContainsAny(name, "/@ ") || strings.ContainsAny(namespace, "@ "):
		return "", "", "", fmt.Errorf("%q: want namespace/name@interface", item)
	case found && namespace == "":
		return "", "", "", fmt.Errorf("%q has an empty namespace", item)
	case strings.Contains(item, "@") && iface == "":
		return "", "", "", fmt.Errorf("%q has an empty interface after @", item)
	}
	return namespace, name, iface, nil
}

// Format prints elements as the JSON list form.
func Format(elems []*Element) (string, error) {
	if elems == nil {
		elems = []*Element{}
	}
	// json.Marshal would HTML-escape &, < and > inside the raw values of
	// untouched keys; an encoder without escaping prints them as they came.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(elems); err != nil {
		return "", fmt.Errorf("encoding %s: %w", NetworksAnnotation, err)
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
