package patch

import (
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
)

// Entries is a string map's content at one moment, sorted by key: the copy
// StringMapSince compares the map with after the mutators ran. An object's
// labels and annotations have a few keys; copying them into one slice
// costs a fraction of cloning the map, a hash table the garbage collector
// then has to trace (a VM's three maps were a twentieth of the bytes its
// admission allocated).
type Entries []Entry

// Entry is one key and its value.
type Entry struct{ Key, Value string }

// Snapshot copies m.
func Snapshot(m map[string]string) Entries {
	if len(m) == 0 {
		return nil
	}
	e := make(Entries, 0, len(m))
	for k, v := range m {
		e = append(e, Entry{k, v})
	}
	slices.SortFunc(e, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return e
}

// Get returns the value of key.
func (e Entries) Get(key string) (string, bool) {
	i, ok := slices.BinarySearchFunc(e, key, func(x Entry, k string) int { return strings.Compare(x.Key, k) })
	if !ok {
		return "", false
	}
	return e[i].Value, true
}

// equal reports whether m holds exactly e.
func (e Entries) equal(m map[string]string) bool {
	if len(e) != len(m) {
		return false
	}
	for _, x := range e {
		if v, ok := m[x.Key]; !ok || v != x.Value {
			return false
		}
	}
	return true
}

// StringMap returns the operations that turn the string map at pointer
// from before into after (see StringMapSince).
func StringMap(pointer string, present bool, before, after map[string]string) []jsonpatch.Operation {
	return StringMapSince(pointer, present, Snapshot(before), after)
}

// StringMapSince returns the operations that turn the string map at
// pointer from before into after, one per key the mutators added, changed
// or deleted: the patch says exactly what changed, with no diff of the
// rest of the object. present tells whether the admitted object has the
// map at all (a missing or null member): if not, the whole map is added in
// one operation, since a key cannot be added under a member that does not
// exist. The pointer's parent must exist in the object.
//
// Keys come in sorted order so equal inputs give equal patches.
func StringMapSince(pointer string, present bool, before Entries, after map[string]string) []jsonpatch.Operation {
	if before.equal(after) {
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
		if old, had := before.Get(k); !had || old != v {
			changed = append(changed, k)
		}
	}
	for _, x := range before {
		if _, kept := after[x.Key]; !kept {
			changed = append(changed, x.Key)
		}
	}
	slices.Sort(changed)
	ops := make([]jsonpatch.Operation, 0, len(changed))
	for _, k := range changed {
		v, kept := after[k]
		_, had := before.Get(k)
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
