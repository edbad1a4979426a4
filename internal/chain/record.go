package chain

import (
	"encoding/json"
	"fmt"
	"slices"
	"unsafe"

	"github.com/kvnet/kvnet/internal/apijson"
)

// Change is one entry of the kvnet.io/mutations annotation.
type Change struct {
	Mutator  string   `json:"mutator"`
	Rule     string   `json:"rule,omitempty"`
	Networks []string `json:"networks,omitempty"`
	// LeftTo names the peer webhook that kvnet left the mutator's job to
	// for Networks: kvnet changed nothing there, and says why.
	LeftTo string `json:"leftTo,omitempty"`
	// MissedBy names the peer webhook that does this job for Networks in
	// the cluster but does not see them: the API server calls it before
	// kvnet added them, and not again. Nobody does the job; a warning and
	// docs/peers.md say how to change that.
	MissedBy string `json:"missedBy,omitempty"`
	// AskedOf names the peer webhook that does this job for Networks but
	// does not see them (as for MissedBy), which kvnet called itself with
	// the object as kvnet leaves it: the job is the peer's, done in
	// kvnet's patch.
	AskedOf string `json:"askedOf,omitempty"`
}

// Record notes that mutator changed networks (rule may be empty).
func (r *Request) Record(mutator, rule string, networks ...string) {
	r.Changes = addChange(r.Changes, Change{Mutator: mutator, Rule: rule}, networks)
}

// RecordLeftTo notes that mutator left its job for networks to peer.
func (r *Request) RecordLeftTo(mutator, peer string, networks ...string) {
	r.Changes = addChange(r.Changes, Change{Mutator: mutator, LeftTo: peer}, networks)
}

// RecordMissedBy notes that peer, registered to do mutator's job, does not
// see networks (Change.MissedBy).
func (r *Request) RecordMissedBy(mutator, peer string, networks ...string) {
	r.Changes = addChange(r.Changes, Change{Mutator: mutator, MissedBy: peer}, networks)
}

// RecordAskedOf notes that kvnet asked peer, which does not see networks,
// to do mutator's job for them, and applied its answer (Change.AskedOf).
func (r *Request) RecordAskedOf(mutator, peer string, networks ...string) {
	r.Changes = addChange(r.Changes, Change{Mutator: mutator, AskedOf: peer}, networks)
}

// Record notes that mutator changed the pod's spec for networks. The pod
// webhook patches the spec only when a change was recorded.
func (r *PodRequest) Record(mutator string, networks ...string) {
	r.Changes = addChange(r.Changes, Change{Mutator: mutator}, networks)
}

// RecordLeftTo notes that mutator left its job for networks to peer. It is
// recorded as a change so that the pod's kvnet.io/mutations says so; the
// spec is compared with what it was and is not patched where it is not.
func (r *PodRequest) RecordLeftTo(mutator, peer string, networks ...string) {
	r.Changes = addChange(r.Changes, Change{Mutator: mutator, LeftTo: peer}, networks)
}

// LeftBefore reports whether the pod already says, in kvnet.io/mutations,
// that mutator left its job to peer: the API server reinvokes kvnet after
// a peer changed the pod, and what is counted or logged once per pod must
// not be again. A record that cannot be read says nothing.
func (r *PodRequest) LeftBefore(mutator, peer string) bool {
	prev := r.Pod.Annotations[MutationsAnnotation]
	if prev == "" {
		return false
	}
	var all []Change
	if json.Unmarshal([]byte(prev), &all) != nil {
		return false
	}
	return slices.ContainsFunc(all, func(c Change) bool { return c.Mutator == mutator && c.LeftTo == peer })
}

func addChange(changes []Change, key Change, networks []string) []Change {
	for i := range changes {
		c := &changes[i]
		if c.Mutator == key.Mutator && c.Rule == key.Rule && c.LeftTo == key.LeftTo && c.MissedBy == key.MissedBy && c.AskedOf == key.AskedOf {
			for _, n := range networks {
				if !slices.Contains(c.Networks, n) {
					c.Networks = append(c.Networks, n)
				}
			}
			return changes
		}
	}
	key.Networks = networks
	if changes == nil {
		// A VM that kvnet changes usually gets a handful of entries (the
		// networks, per rule, vDPA, kube-ovn): grow once, not per entry.
		changes = make([]Change, 0, 6)
	}
	return append(changes, key)
}

// recordChanges merges this request's changes into kvnet.io/mutations, so a
// later UPDATE that changes more keeps the record of the first.
func recordChanges(req *Request) error {
	return recordInto(&req.Meta.Annotations, req.Changes)
}

// recordPodChanges does the same for a pod: the pod's own kvnet.io/mutations
// says what kvnet changed in its spec (device resources, node selector).
func recordPodChanges(req *PodRequest) error {
	return recordInto(&req.Pod.Annotations, req.Changes)
}

// recordInto merges changes into the kvnet.io/mutations annotation of the
// map annotations points at.
func recordInto(annotations *map[string]string, changes []Change) error {
	if len(changes) == 0 {
		return nil
	}
	// changes holds each (mutator, rule, peer) once already (addChange):
	// with no earlier record it is the record.
	all := changes
	if prev := (*annotations)[MutationsAnnotation]; prev != "" {
		var before []Change
		// A record we cannot read is replaced, not fatal: it is informational.
		_ = json.Unmarshal([]byte(prev), &before)
		for _, c := range changes {
			before = addChange(before, Change{Mutator: c.Mutator, Rule: c.Rule, LeftTo: c.LeftTo, MissedBy: c.MissedBy, AskedOf: c.AskedOf}, c.Networks)
		}
		all = before
	}
	b, err := appendChanges(make([]byte, 0, 64*len(all)), all)
	if err != nil {
		return fmt.Errorf("recording mutations: %w", err)
	}
	if *annotations == nil {
		*annotations = map[string]string{}
	}
	// b is this call's own buffer, never written again: the annotation is
	// its bytes, not a copy of them (as strings.Builder hands out its own).
	(*annotations)[MutationsAnnotation] = unsafe.String(unsafe.SliceData(b), len(b))
	return nil
}

// appendChanges appends changes as encoding/json encodes them (the
// members in Change's order, empty ones left out), without its reflection
// and its copy of the result: the record is written on every VM kvnet
// changes. TestChangesEncodeAsEncodingJSON holds it to encoding/json's
// bytes.
func appendChanges(b []byte, changes []Change) ([]byte, error) {
	b = append(b, '[')
	var err error
	for i := range changes {
		c := &changes[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"mutator":`...)
		if b, err = apijson.AppendString(b, c.Mutator); err != nil {
			return nil, err
		}
		if c.Rule != "" {
			b = append(b, `,"rule":`...)
			if b, err = apijson.AppendString(b, c.Rule); err != nil {
				return nil, err
			}
		}
		if len(c.Networks) > 0 {
			b = append(b, `,"networks":[`...)
			for j, n := range c.Networks {
				if j > 0 {
					b = append(b, ',')
				}
				if b, err = apijson.AppendString(b, n); err != nil {
					return nil, err
				}
			}
			b = append(b, ']')
		}
		for _, f := range [...]struct{ key, value string }{{`,"leftTo":`, c.LeftTo}, {`,"missedBy":`, c.MissedBy}, {`,"askedOf":`, c.AskedOf}} {
			if f.value == "" {
				continue
			}
			b = append(b, f.key...)
			if b, err = apijson.AppendString(b, f.value); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	return append(b, ']'), nil
}
