package chain

import (
	"context"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/requested"
)

// WantedNetworks lists the networks the matching config rules ask for, then
// the annotation's, in order. A malformed annotation is a 422 on its field.
// The network injector adds them, and the persistent-IPs validator checks
// them: both read this one list. The namespace's labels are read only when
// a rule selects on them.
func (r *Request) WantedNetworks(ctx context.Context) ([]requested.Wanted, error) {
	var asked []config.Network
	if v, ok := r.Meta.Annotations[requested.Annotation]; ok {
		nets, errs := requested.Parse(v, requested.AnnotationPath)
		if len(errs) > 0 {
			return nil, r.Invalid(errs)
		}
		asked = nets
	}
	var matched []*config.NetworkRule
	count := len(asked)
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
		if rule.Matches(nsLabels, r.Meta.Labels) {
			matched = append(matched, rule)
			count += len(rule.Networks)
		}
	}
	if count == 0 {
		return nil, nil
	}
	out := make([]requested.Wanted, 0, count)
	for _, rule := range matched {
		for i := range rule.Networks {
			out = append(out, requested.Wanted{Rule: rule.Name, Network: &rule.Networks[i]})
		}
	}
	for i := range asked {
		out = append(out, requested.Wanted{Rule: requested.Annotation, Network: &asked[i]})
	}
	return out, nil
}
