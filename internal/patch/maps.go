package patch

import (
	"maps"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
)

// StringMap returns the operations that turn the string map at pointer from
// before into after, one per key the mutators added, changed or deleted:
// the patch says exactly what changed, with no diff of the rest of the
// object. present tells whether the admitted object has the map at all (a
// missing or null member): if not, the whole map is added in one operation,
// since a key cannot be added under a member that does not exist. The
// pointer's parent must exist in the object.
//
// Keys come in sorted order so equal inputs give equal patches.
func StringMap(pointer string, present bool, before, after map[string]string) []jsonpatch.Operation {
	if maps.Equal(before, after) {
		return nil
	}
	if !present {
		if len(after) == 0 {
			return nil
		}
		return []jsonpatch.Operation{{Operation: "add", Path: pointer, Value: after}}
	}
	// Sort only the keys that changed (usually one or two), not the maps.
	var changed []string
	for k, v := range after {
		if old, had := before[k]; !had || old != v {
			changed = append(changed, k)
		}
	}
	for k := range before {
		if _, kept := after[k]; !kept {
			changed = append(changed, k)
		}
	}
	slices.Sort(changed)
	ops := make([]jsonpatch.Operation, 0, len(changed))
	for _, k := range changed {
		v, kept := after[k]
		_, had := before[k]
		switch {
		case !kept:
			ops = append(ops, jsonpatch.Operation{Operation: "remove", Path: pointer + "/" + escape(k)})
		case !had:
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: pointer + "/" + escape(k), Value: v})
		default:
			ops = append(ops, jsonpatch.Operation{Operation: "replace", Path: pointer + "/" + escape(k), Value: v})
		}
	}
	return ops
}

// escape encodes one JSON pointer segment (RFC 6901): "~" as "~0", "/" as "~1".
func escape(s string) string {
	if !containsAny(s) {
		return s
	}
	return joinPointer([]string{s})[1:]
}

func containsAny(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == '~' || s[i] == '/' {
			return true
		}
	}
	return false
}
