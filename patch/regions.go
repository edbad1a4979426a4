package patch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
)

// Region is one part of the admitted object, encoded before and after the
// chain. Diffing the few regions mutators may write, instead of the whole
// object, skips encoding and diffing what they never touch (most of a
// VM's spec, its status, its managedFields).
type Region struct {
	// Pointer locates the region in the object, e.g. /spec/template/spec/networks.
	Pointer string
	// Before and After are the region's JSON; "null" when it is unset.
	Before, After []byte
}

// ComputeRegions returns the operations that carry every region's change
// into raw. Regions must not overlap.
func ComputeRegions(raw []byte, regions []Region) ([]jsonpatch.Operation, error) {
	var ops []jsonpatch.Operation
	for _, r := range regions {
		if bytes.Equal(r.Before, r.After) {
			continue
		}
		switch {
		case isNull(r.Before):
			v, err := decode(r.After)
			if err != nil {
				return nil, err
			}
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: r.Pointer, Value: v})
		case isNull(r.After):
			ops = append(ops, jsonpatch.Operation{Operation: "remove", Path: r.Pointer})
		default:
			sub, err := jsonpatch.CreatePatch(r.Before, r.After)
			if err != nil {
				return nil, fmt.Errorf("diffing %s: %w", r.Pointer, err)
			}
			if flatMembers(sub) {
				// CreatePatch walks maps in Go's random order; members of
				// one object are independent, so sorting them makes equal
				// requests get byte-equal patches.
				sort.Sort(jsonpatch.ByPath(sub))
			}
			for _, op := range sub {
				op.Path = r.Pointer + op.Path
				ops = append(ops, op)
			}
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return applicable(raw, ops, func(segs []string) (any, error) { return regionValue(regions, segs) })
}

// regionValue is the mutated value at segs: inside a region, read from its
// After; above regions (a parent raw lacks), an object nesting every region
// below it that has a value.
func regionValue(all []Region, segs []string) (any, error) {
	p := joinPointer(segs)
	for _, r := range all {
		if p == r.Pointer || strings.HasPrefix(p, r.Pointer+"/") {
			rel := splitPointer(strings.TrimPrefix(p, r.Pointer))
			return valueAt(r.After, rel)
		}
	}
	root := map[string]any{}
	for _, r := range all {
		if !strings.HasPrefix(r.Pointer, p+"/") || isNull(r.After) {
			continue
		}
		v, err := decode(r.After)
		if err != nil {
			return nil, err
		}
		rel := splitPointer(strings.TrimPrefix(r.Pointer, p))
		m := root
		for _, s := range rel[:len(rel)-1] {
			next, ok := m[s].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[s] = next
			}
			m = next
		}
		m[rel[len(rel)-1]] = v
	}
	return root, nil
}

// flatMembers reports whether every operation is on a direct member of the
// region's object (as for labels and annotations), not inside a list.
func flatMembers(ops []jsonpatch.Operation) bool {
	for _, op := range ops {
		if strings.Count(op.Path, "/") != 1 {
			return false
		}
		if _, err := strconv.Atoi(op.Path[1:]); err == nil {
			return false // a list index
		}
	}
	return true
}

func isNull(b []byte) bool { return len(b) == 0 || string(bytes.TrimSpace(b)) == "null" }

func decode(b []byte) (any, error) {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("patch: decoding a region: %w", err)
	}
	return v, nil
}
