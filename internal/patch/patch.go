// Package patch builds the one JSON patch an admission response carries,
// from the operations the chain made rather than from a diff of the whole
// object.
//
// Three shapes of operation come out of it: Nested adds values under a
// parent the object may lack (one add of the first missing ancestor),
// StringMap edits annotation and label maps key by key, and ComputeAt
// diffs one value the admitted object already had (an interface gaining a
// binding) member by member against its raw JSON. That last one is the
// only diff: the typed value lacks the fields a newer KubeVirt added, so
// replacing it whole would delete them, and Compute keeps every member of
// the raw value that the typed marshal lacks. A typed marshal does contain
// empty parents the raw value may lack, so each operation whose parent is
// missing from raw is lifted to add the nearest missing ancestor whole.
package patch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
)

// Compute returns the operations that turn raw into raw-with-the-changes
// between before and after, keeping every field of raw that before lacks.
// ComputeAt is its caller in the webhook; it is exported so that its cases
// are tested on their own.
func Compute(raw, before, after []byte) ([]jsonpatch.Operation, error) {
	if bytes.Equal(before, after) {
		return nil, nil
	}
	ops, err := jsonpatch.CreatePatch(before, after)
	if err != nil {
		return nil, fmt.Errorf("diffing the mutated object: %w", err)
	}
	return applicable(raw, ops, func(segs []string) (any, error) { return valueAt(after, segs) })
}

// applicable makes ops apply to raw: an operation whose parent raw lacks becomes an
// add of the first missing ancestor (its value from valueOf), a replace of a
// member raw lacks becomes an add, and a remove of one is dropped.
func applicable(raw []byte, ops []jsonpatch.Operation, valueOf func(segs []string) (any, error)) ([]jsonpatch.Operation, error) {
	out := ops[:0]
	lifted := map[string]bool{}
	idx := newRawIndex(raw)
	for _, op := range ops {
		segs := splitPointer(op.Path)
		if len(segs) == 0 {
			out = append(out, op)
			continue
		}
		n, err := idx.depth(segs[:len(segs)-1])
		if err != nil {
			return nil, err
		}
		if n == len(segs)-1 {
			if op.Operation == "replace" || op.Operation == "remove" {
				// The typed marshal may hold a member raw lacks (a non-omitempty
				// zero value): replacing it means adding it, removing it nothing.
				if m, err := idx.depth(segs); err != nil {
					return nil, err
				} else if m < len(segs) {
					if op.Operation == "remove" {
						continue
					}
					op.Operation = "add"
				}
			}
			out = append(out, op)
			continue
		}
		if op.Operation == "remove" {
			continue // its parent is not in raw, so neither is it
		}
		// Add the first missing ancestor, with its whole value.
		anc := segs[:n+1]
		p := joinPointer(anc)
		if lifted[p] {
			continue
		}
		lifted[p] = true
		v, err := valueOf(anc)
		if err != nil {
			return nil, err
		}
		out = append(out, jsonpatch.Operation{Operation: "add", Path: p, Value: v})
	}
	return out, nil
}

// rawIndex tells which paths exist in the raw object. Each object or list
// of raw is decoded at most once, however many operations ask about it:
// decoding the whole request once per operation would cost more than the
// diff itself.
type rawIndex struct {
	root    json.RawMessage
	objects map[string]map[string]json.RawMessage // by JSON pointer
	lists   map[string][]json.RawMessage
}

func newRawIndex(raw []byte) *rawIndex {
	return &rawIndex{root: raw, objects: map[string]map[string]json.RawMessage{}, lists: map[string][]json.RawMessage{}}
}

// depth returns how many leading segments of segs exist in raw.
func (x *rawIndex) depth(segs []string) (int, error) {
	cur, prefix := x.root, ""
	for i, s := range segs {
		next, ok, err := x.child(prefix, cur, s)
		if err != nil {
			return 0, err
		}
		if !ok {
			return i, nil
		}
		cur, prefix = next, prefix+joinPointer(segs[i:i+1])
	}
	return len(segs), nil
}

// child returns member or element seg of doc, the value at pointer prefix.
func (x *rawIndex) child(prefix string, doc json.RawMessage, seg string) (json.RawMessage, bool, error) {
	t := bytes.TrimLeft(doc, " \t\r\n")
	if len(t) == 0 {
		return nil, false, nil
	}
	switch t[0] {
	case '{':
		m, ok := x.objects[prefix]
		if !ok {
			if err := json.Unmarshal(t, &m); err != nil {
				return nil, false, fmt.Errorf("patch: reading object: %w", err)
			}
			x.objects[prefix] = m
		}
		v, ok := m[seg]
		if ok && string(bytes.TrimSpace(v)) == "null" {
			return nil, false, nil
		}
		return v, ok, nil
	case '[':
		a, ok := x.lists[prefix]
		if !ok {
			if err := json.Unmarshal(t, &a); err != nil {
				return nil, false, fmt.Errorf("patch: reading list: %w", err)
			}
			x.lists[prefix] = a
		}
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(a) {
			return nil, false, nil
		}
		return a[i], true, nil
	}
	return nil, false, nil
}

func valueAt(doc []byte, segs []string) (any, error) {
	cur := json.RawMessage(doc)
	for _, s := range segs {
		next, ok, err := child(cur, s)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("patch: %s is not in the mutated object", joinPointer(segs))
		}
		cur = next
	}
	var v any
	if err := json.Unmarshal(cur, &v); err != nil {
		return nil, fmt.Errorf("patch: decoding %s: %w", joinPointer(segs), err)
	}
	return v, nil
}

// child decodes one level of doc and returns the member or element seg.
func child(doc json.RawMessage, seg string) (json.RawMessage, bool, error) {
	t := bytes.TrimLeft(doc, " \t\r\n")
	if len(t) == 0 {
		return nil, false, nil
	}
	switch t[0] {
	case '{':
		var m map[string]json.RawMessage
		if err := json.Unmarshal(t, &m); err != nil {
			return nil, false, fmt.Errorf("patch: reading object: %w", err)
		}
		v, ok := m[seg]
		if ok && string(bytes.TrimSpace(v)) == "null" {
			return nil, false, nil
		}
		return v, ok, nil
	case '[':
		var a []json.RawMessage
		if err := json.Unmarshal(t, &a); err != nil {
			return nil, false, fmt.Errorf("patch: reading list: %w", err)
		}
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(a) {
			return nil, false, nil
		}
		return a[i], true, nil
	}
	return nil, false, nil
}

func splitPointer(p string) []string {
	if p == "" || p == "/" {
		return nil
	}
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, s := range segs {
		segs[i] = strings.ReplaceAll(strings.ReplaceAll(s, "~1", "/"), "~0", "~")
	}
	return segs
}

func joinPointer(segs []string) string {
	var b strings.Builder
	for _, s := range segs {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1"))
	}
	return b.String()
}
