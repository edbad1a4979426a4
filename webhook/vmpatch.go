package webhook

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"

	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/patch"
)

// regionValues are the regions' values before the chain ran, in Regions' order.
type regionValues struct {
	maps       []patch.Entries
	networks   []kubevirtv1.Network
	interfaces []kubevirtv1.Interface
	multiqueue *bool
	memory     *kubevirtv1.Memory
}

// snapshot copies each region's value before the chain runs: mutators
// change the typed object in place, and the patch is what changed between
// the copy and the object after the chain.
func snapshot(rs chain.Regions) regionValues {
	b := regionValues{
		maps:       make([]patch.Entries, len(rs.Maps)),
		networks:   deepCopies(*rs.Networks.Field, func(in, out *kubevirtv1.Network) { in.DeepCopyInto(out) }),
		interfaces: deepCopies(*rs.Interfaces.Field, func(in, out *kubevirtv1.Interface) { in.DeepCopyInto(out) }),
		memory:     (*rs.Memory.Field).DeepCopy(),
	}
	for i, m := range rs.Maps {
		b.maps[i] = patch.Snapshot(*m.Field)
	}
	if mq := *rs.Multiqueue.Field; mq != nil {
		b.multiqueue = ptr.To(*mq)
	}
	return b
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
// annotation or label key, an add per network and interface appended, a
// remove per one taken away, an add or replace of multiqueue, and each
// member whole (or under its first missing parent) where the admitted
// object lacks it. A generic diff is left only for a value the object
// already had and a mutator changed inside (see diffAt), so every field
// kvnet's typed view does not hold survives, and nothing else of the
// object is encoded or diffed.
func vmPatch(raw []byte, shape *vmShape, rs chain.Regions, b regionValues) ([]jsonpatch.Operation, error) {
	// Room for what a VM gaining networks usually needs: the record, the
	// template's annotations, multiqueue, memory and two more, and an add
	// per network and interface appended.
	added := max(0, len(*rs.Networks.Field)-len(b.networks)) + max(0, len(*rs.Interfaces.Field)-len(b.interfaces))
	n := patch.Nested{Ops: make([]jsonpatch.Operation, 0, 6+added)}
	for i, m := range rs.Maps {
		if after := *m.Field; absent(&n, shape, m.Pointer, after, len(after) == 0) {
			n.Ops = append(n.Ops, patch.StringMapSince(m.Pointer, true, b.maps[i], after)...)
		}
	}
	if err := listRegion(&n, raw, shape, rs.Networks, b.networks, shape.whole.networks, func(e *kubevirtv1.Network) string { return e.Name }); err != nil {
		return nil, err
	}
	if err := listRegion(&n, raw, shape, rs.Interfaces, b.interfaces, shape.whole.interfaces, func(e *kubevirtv1.Interface) string { return e.Name }); err != nil {
		return nil, err
	}
	if after, p := *rs.Multiqueue.Field, rs.Multiqueue.Pointer; absent(&n, shape, p, after, after == nil) {
		switch {
		case after == nil:
			n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "remove", Path: p})
		case b.multiqueue == nil || *after != *b.multiqueue:
			n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "replace", Path: p, Value: *after})
		}
	}
	if after, p := *rs.Memory.Field, rs.Memory.Pointer; absent(&n, shape, p, after, after == nil) {
		switch {
		case reflect.DeepEqual(b.memory, after):
		case after == nil:
			n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "remove", Path: p})
		default:
			if err := diffAt(&n, raw, p, b.memory, after); err != nil {
				return nil, err
			}
		}
	}
	return n.Ops, nil
}

// absent handles a region the admitted object lacks: its value, unless
// empty, is added whole under the first missing parent. It reports whether
// the object has the region, for the caller to patch what changed in it.
func absent(n *patch.Nested, shape *vmShape, pointer string, after any, empty bool) bool {
	if shape.has(pointer) {
		return true
	}
	if !empty {
		n.Add(pointer, shape.missing(pointer), after)
	}
	return false
}

// listRegion adds the operations for list region r: the list whole where
// the object lacks it, else listOps, or, where the admitted list was read
// whole (whole: the typed elements hold every member the object's had),
// one replace of the list when listOps finds anything to change: the same
// object in one operation (a VM declaring its pod network and gaining four
// networks had eight adds, each with its path).
func listRegion[T any](n *patch.Nested, raw []byte, shape *vmShape, r chain.Region[[]T], before []T, whole bool, name func(*T) string) error {
	after := *r.Field
	if !absent(n, shape, r.Pointer, after, len(after) == 0) {
		return nil
	}
	if !whole || len(after) == 0 {
		return listOps(n, raw, r.Pointer, before, after, name)
	}
	if changed, err := listChanged(r.Pointer, before, after, name); err != nil || !changed {
		return err
	}
	n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "replace", Path: r.Pointer, Value: r.Field}) // the request's list: &after would escape
	return nil
}

// listChanged reports whether after differs from before, refusing what
// listOps refuses (a kept element moved), without building the operations
// listOps would: a list read whole is replaced whole, so only whether it
// changed matters.
func listChanged[T any](pointer string, before, after []T, name func(*T) string) (bool, error) {
	changed := len(after) != len(before)
	kept := 0 // after[:kept] are before's elements, in order
	for i := range before {
		if kept < len(after) && name(&after[kept]) == name(&before[i]) {
			changed = changed || !reflect.DeepEqual(before[i], after[kept])
			kept++
			continue
		}
		changed = true
	}
	return changed, unmoved(pointer, before, after, kept, name)
}

// listOps: the mutators append networks and interfaces, and may complete
// one the object had (vDPA gives an interface its binding). Elements are
// matched by name, which KubeVirt keeps unique in each list. A changed
// element is diffed against the admitted one, at its admitted index; an
// element taken away is a remove, last first, so each index is still the
// admitted one when its remove applies; an appended element is an add at
// the end, with the typed value (it is kvnet's, so it has no field kvnet
// does not know). Diffing a shortened list whole would instead move the
// fields kvnet's types do not hold from one element to the next. A list
// whose kept elements changed order is refused: kvnet never reorders, and
// a JSON patch that did would need moves no mutator asks for.
func listOps[T any](n *patch.Nested, raw []byte, pointer string, before, after []T, name func(*T) string) error {
	if len(after) == 0 {
		if len(before) > 0 {
			n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "remove", Path: pointer})
		}
		return nil
	}
	var removed []int
	kept := 0 // after[:kept] are before's elements, in order
	for i := range before {
		if kept < len(after) && name(&after[kept]) == name(&before[i]) {
			if !reflect.DeepEqual(before[i], after[kept]) {
				if err := diffAt(n, raw, pointer+"/"+strconv.Itoa(i), before[i], after[kept]); err != nil {
					return err
				}
			}
			kept++
			continue
		}
		removed = append(removed, i)
	}
	if err := unmoved(pointer, before, after, kept, name); err != nil {
		return err
	}
	for _, i := range slices.Backward(removed) {
		n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "remove", Path: pointer + "/" + strconv.Itoa(i)})
	}
	// One path for every append, and each value by pointer: an element
	// boxed into the operation's interface would be copied to the heap.
	end := pointer + "/-"
	for j := kept; j < len(after); j++ {
		n.Ops = append(n.Ops, jsonpatch.Operation{Operation: "add", Path: end, Value: &after[j]})
	}
	return nil
}

// unmoved refuses a list whose elements after after[:kept] (the kept
// ones, in before's order) include one of before's: a kept element moved.
func unmoved[T any](pointer string, before, after []T, kept int, name func(*T) string) error {
	for j := kept; j < len(after); j++ {
		for i := range before {
			if name(&after[j]) == name(&before[i]) {
				return fmt.Errorf("%s: %q moved from index %d to %d; the mutators append, complete or remove elements, never reorder them", pointer, name(&after[j]), i, j)
			}
		}
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
