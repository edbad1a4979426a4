package chain

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Change is one entry of the kvnet.io/mutations annotation.
type Change struct {
	Mutator  string   `json:"mutator"`
	Rule     string   `json:"rule,omitempty"`
	Networks []string `json:"networks,omitempty"`
}

// Record notes that mutator changed networks (rule may be empty).
func (r *Request) Record(mutator, rule string, networks ...string) {
	r.Changes = addChange(r.Changes, mutator, rule, networks)
}

// Record notes that mutator changed the pod's spec for networks. The pod
// webhook patches the spec only when a change was recorded.
func (r *PodRequest) Record(mutator string, networks ...string) {
	r.Changes = addChange(r.Changes, mutator, "", networks)
}

func addChange(changes []Change, mutator, rule string, networks []string) []Change {
	for i := range changes {
		c := &changes[i]
		if c.Mutator == mutator && c.Rule == rule {
			for _, n := range networks {
				if !slices.Contains(c.Networks, n) {
					c.Networks = append(c.Networks, n)
				}
			}
			return changes
		}
	}
	return append(changes, Change{Mutator: mutator, Rule: rule, Networks: networks})
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
	var all []Change
	if prev := (*annotations)[MutationsAnnotation]; prev != "" {
		// A record we cannot read is replaced, not fatal: it is informational.
		_ = json.Unmarshal([]byte(prev), &all)
	}
	for _, c := range changes {
		merged := false
		for i := range all {
			if all[i].Mutator == c.Mutator && all[i].Rule == c.Rule {
				for _, n := range c.Networks {
					if !slices.Contains(all[i].Networks, n) {
						all[i].Networks = append(all[i].Networks, n)
					}
				}
				merged = true
				break
			}
		}
		if !merged {
			all = append(all, c)
		}
	}
	b, err := json.Marshal(all)
	if err != nil {
		return fmt.Errorf("recording mutations: %w", err)
	}
	if *annotations == nil {
		*annotations = map[string]string{}
	}
	(*annotations)[MutationsAnnotation] = string(b)
	return nil
}
