package patch

import (
	"encoding/json"
	"fmt"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
)

// Nested assembles the adds of values whose parent the object may lack.
// A value whose parent exists is one add at its own pointer; one whose
// parent is missing is nested under the first missing ancestor, and a
// single add of that ancestor carries every value below it (a VM without a
// template gains spec.template with its networks, interfaces and
// annotations in one operation).
type Nested struct {
	Ops []jsonpatch.Operation
}

// Add sets pointer to value. missing is the first ancestor of pointer the
// object lacks (or has as null), "" when pointer's parent exists.
func (n *Nested) Add(pointer, missing string, value any) {
	if missing == "" {
		n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "add", Path: pointer, Value: value})
		return
	}
	var root map[string]any
	for _, op := range n.Ops {
		if op.Path == missing {
			root, _ = op.Value.(map[string]any)
		}
	}
	if root == nil {
		root = map[string]any{}
		n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "add", Path: missing, Value: root})
	}
	segs := splitPointer(strings.TrimPrefix(pointer, missing))
	m := root
	for _, s := range segs[:len(segs)-1] {
		next, ok := m[s].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[s] = next
		}
		m = next
	}
	m[segs[len(segs)-1]] = value
}

// ComputeAt is Compute for the value at pointer in raw: the operations,
// with paths from raw's root, that turn it into after, keeping every member
// of raw's value that before lacks. The webhook uses it only where the
// mutators changed a value the admitted object already had (an interface
// gaining a binding, memory gaining memLock): the typed value does not hold
// the fields a newer KubeVirt added, so replacing it whole would delete
// them, and a member-level diff against the raw value is the only safe way.
func ComputeAt(raw []byte, pointer string, before, after []byte) ([]jsonpatch.Operation, error) {
	sub := json.RawMessage(raw)
	for _, s := range splitPointer(pointer) {
		next, ok, err := child(sub, s)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("patch: %s is not in the admitted object", pointer)
		}
		sub = next
	}
	ops, err := Compute(sub, before, after)
	if err != nil {
		return nil, err
	}
	for i := range ops {
		ops[i].Path = pointer + ops[i].Path
	}
	return ops, nil
}
