package chain

import (
	"context"

	"github.com/kvnet/kvnet/internal/model/requested"
)

// WantedNetworks lists the networks the matching config rules ask for, then
// the annotation's, in order. A malformed annotation is a 422 on its field.
// The network injector adds them, and the persistent-IPs validator checks
// them: both read this one list. The namespace's labels are read only when
// a rule selects on them.
func (r *Request) WantedNetworks(ctx context.Context) ([]requested.Wanted, error) {
	var out []requested.Wanted
	var nsLabels map[string]string
	nsRead := false
	for i := range r.Config.NetworkRules {
		rule := &r.Config.NetworkRules[i]
		if rule.NeedsNamespaceLabels() && !nsRead {
			var err error
			if nsLabels, err = r.Facts.NamespaceLabels(ctx, r.Namespace); err != nil {
				return nil, err
			}
			nsRead = true
		}
		if !rule.Matches(nsLabels, r.Meta.Labels) {
			continue
		}
		for _, n := range rule.Networks {
			out = append(out, requested.Wanted{Rule: rule.Name, Network: n})
		}
	}
	if v, ok := r.Meta.Annotations[requested.Annotation]; ok {
		nets, errs := requested.Parse(v, requested.AnnotationPath)
		if len(errs) > 0 {
			return nil, r.Invalid(errs)
		}
		for _, n := range nets {
			out = append(out, requested.Wanted{Rule: requested.Annotation, Network: n})
		}
	}
	return out, nil
}
