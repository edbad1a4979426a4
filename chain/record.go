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
	for i := range r.Changes {
		c := &r.Changes[i]
		if c.Mutator == mutator && c.Rule == rule {
			for _, n := range networks {
				if !slices.Contains(c.Networks, n) {
					c.Networks = append(c.Networks, n)
				}
			}
			return
		}
	}
	r.Changes = append(r.Changes, Change{Mutator: mutator, Rule: rule, Networks: networks})
}

// recordChanges merges this request's changes into kvnet.io/mutations, so a
// later UPDATE that changes more keeps the record of the first.
func recordChanges(req *Request) error {
	if len(req.Changes) == 0 {
		return nil
	}
	var all []Change
	if prev := req.Meta.Annotations[MutationsAnnotation]; prev != "" {
		// A record we cannot read is replaced, not fatal: it is informational.
		_ = json.Unmarshal([]byte(prev), &all)
	}
	for _, c := range req.Changes {
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
	if req.Meta.Annotations == nil {
		req.Meta.Annotations = map[string]string{}
	}
	req.Meta.Annotations[MutationsAnnotation] = string(b)
	return nil
}
