// Package patch computes the one JSON patch an admission response carries.
//
// Mutators work on typed structs, so the diff is taken between two marshals
// of the same struct (before and after the chain). Diffing against the raw
// request instead would emit "remove" operations for every field the vendored
// KubeVirt API does not know, deleting data a newer KubeVirt wrote. A typed
// marshal does contain empty parents the raw object may lack (a template
// without metadata marshals as "metadata": {}), so each operation whose
// parent is missing from the raw object is lifted to add the nearest missing
// ancestor whole.
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
func Compute(raw, before, after []byte) ([]jsonpatch.Operation, error) {
	if bytes.Equal(before, after) {
		return nil, nil
	}
	ops, err := jsonpatch.CreatePatch(before, after)
	if err != nil {
		return nil, fmt.Errorf("diffing the mutated object: %w", err)
	}
	out := ops[:0]
	lifted := map[string]bool{}
	for _, op := range ops {
		segs := splitPointer(op.Path)
		if len(segs) == 0 {
			out = append(out, op)
			continue
		}
		n, err := existingDepth(raw, segs[:len(segs)-1])
		if err != nil {
			return nil, err
		}
		if n == len(segs)-1 {
			if op.Operation == "replace" || op.Operation == "remove" {
				// The typed marshal may hold a member raw lacks (a non-omitempty
				// zero value): replacing it means adding it, removing it nothing.
				if m, err := existingDepth(raw, segs); err != nil {
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
		// Add the first missing ancestor, with its whole value from after.
		anc := segs[:n+1]
		p := joinPointer(anc)
		if lifted[p] {
			continue
		}
		lifted[p] = true
		v, err := valueAt(after, anc)
		if err != nil {
			return nil, err
		}
		out = append(out, jsonpatch.Operation{Operation: "add", Path: p, Value: v})
	}
	return out, nil
}

// existingDepth returns how many leading segments of segs exist in doc.
func existingDepth(doc []byte, segs []string) (int, error) {
	cur := json.RawMessage(doc)
	for i, s := range segs {
		next, ok, err := child(cur, s)
		if err != nil {
			return 0, err
		}
		if !ok {
			return i, nil
		}
		cur = next
	}
	return len(segs), nil
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
