package webhook

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strconv"

	"gomodules.xyz/jsonpatch/v2"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/patch"
)

// snapshot copies each region's value before the chain runs: mutators
// change the typed object in place, and the patch is what changed between
// the copy and the object after the chain.
func snapshot(regions []chain.Region) ([]any, error) {
	out := make([]any, len(regions))
	for i, r := range regions {
		switch v := r.Value().(type) {
		case map[string]string:
			out[i] = maps.Clone(v)
		case []kubevirtv1.Network:
			out[i] = deepCopies(v, func(in, out *kubevirtv1.Network) { in.DeepCopyInto(out) })
		case []kubevirtv1.Interface:
			out[i] = deepCopies(v, func(in, out *kubevirtv1.Interface) { in.DeepCopyInto(out) })
		case *bool:
			if v != nil {
				b := *v
				v = &b
			}
			out[i] = v
		case *kubevirtv1.Memory:
			out[i] = v.DeepCopy()
		default:
			// A region of another type: its encoding is the copy, and the
			// generic diff its patch (see regionOps).
			b, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("encoding %s: %w", r.Pointer, err)
			}
			out[i] = b
		}
	}
	return out, nil
}

func deepCopies[T any](in []T, copyInto func(in, out *T)) []T {
	if in == nil {
		return nil
	}
	out := make([]T, len(in))
	for i := range in {
		copyInto(&in[i], &out[i])
	}
	return out
}

// vmPatch is the JSON patch for what the mutators changed in a VM or VMI,
// built from the changes themselves: an add, replace or remove per
// annotation or label key, an add per network and interface appended, an
// add or replace of multiqueue, and each member whole (or under its first
// missing parent) where the admitted object lacks it. A generic diff is
// left only for a value the object already had and a mutator changed
// inside (see regionOps), so every field kvnet's typed view does not hold
// survives, and nothing else of the object is encoded or diffed.
func vmPatch(raw []byte, shape *vmShape, regions []chain.Region, before []any) ([]jsonpatch.Operation, error) {
	var n patch.Nested
	for i, r := range regions {
		if err := regionOps(&n, raw, shape, r.Pointer, before[i], r.Value()); err != nil {
			return nil, err
		}
	}
	return n.Ops, nil
}

// regionOps adds to n the operations that turn region pointer from before
// into after.
func regionOps(n *patch.Nested, raw []byte, shape *vmShape, pointer string, before, after any) error {
	if !shape.has(pointer) {
		if !empty(after) {
			n.Add(pointer, shape.missing(pointer), after)
		}
		return nil
	}
	switch b := before.(type) {
	case map[string]string:
		n.Ops = append(n.Ops, patch.StringMap(pointer, true, b, after.(map[string]string))...)
		return nil
	case []kubevirtv1.Network:
		return listOps(n, raw, pointer, b, after.([]kubevirtv1.Network))
	case []kubevirtv1.Interface:
		return listOps(n, raw, pointer, b, after.([]kubevirtv1.Interface))
	case *bool:
		a := after.(*bool)
		switch {
		case a == nil:
			n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "remove", Path: pointer})
		case *a != *b:
			n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "replace", Path: pointer, Value: *a})
		}
		return nil
	case *kubevirtv1.Memory:
		a := after.(*kubevirtv1.Memory)
		switch {
		case reflect.DeepEqual(b, a):
			return nil
		case a == nil:
			n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "remove", Path: pointer})
			return nil
		}
		return diffAt(n, raw, pointer, b, a)
	case []byte:
		a, err := json.Marshal(after)
		if err != nil {
			return fmt.Errorf("encoding mutated %s: %w", pointer, err)
		}
		ops, err := patch.ComputeAt(raw, pointer, b, a)
		n.Ops = append(n.Ops, ops...)
		return err
	}
	return fmt.Errorf("region %s has unexpected type %T", pointer, before)
}

// listOps: the mutators append networks and interfaces, and may complete
// one the object had (vDPA gives an interface its binding). An appended
// element is an add at the end, with the typed value (it is kvnet's, so
// it has no field kvnet does not know); a changed element is diffed
// against the admitted one; a list that got shorter is diffed whole.
func listOps[T any](n *patch.Nested, raw []byte, pointer string, before, after []T) error {
	switch {
	case len(after) == 0 && len(before) == 0:
		return nil
	case len(after) == 0:
		n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "remove", Path: pointer})
		return nil
	case len(after) < len(before):
		return diffAt(n, raw, pointer, before, after)
	}
	for i := range before {
		if !reflect.DeepEqual(before[i], after[i]) {
			if err := diffAt(n, raw, pointer+"/"+strconv.Itoa(i), before[i], after[i]); err != nil {
				return err
			}
		}
	}
	for _, e := range after[len(before):] {
		n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "add", Path: pointer + "/-", Value: e})
	}
	return nil
}

// diffAt adds the member-level diff of the value at pointer: the typed
// value lacks the fields a newer KubeVirt has, so replacing it whole would
// delete them from the object.
func diffAt(n *patch.Nested, raw []byte, pointer string, before, after any) error {
	b, err := json.Marshal(before)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", pointer, err)
	}
	a, err := json.Marshal(after)
	if err != nil {
		return fmt.Errorf("encoding mutated %s: %w", pointer, err)
	}
	ops, err := patch.ComputeAt(raw, pointer, b, a)
	n.Ops = append(n.Ops, ops...)
	return err
}

// empty reports whether a region's value adds nothing: unset, or an empty
// map or list.
func empty(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case map[string]string:
		return len(v) == 0
	case []kubevirtv1.Network:
		return len(v) == 0
	case []kubevirtv1.Interface:
		return len(v) == 0
	case *bool:
		return v == nil
	case *kubevirtv1.Memory:
		return v == nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Map, reflect.Slice:
		return rv.Len() == 0
	case reflect.Pointer, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
