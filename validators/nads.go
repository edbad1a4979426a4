package validators

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
)

// NADs checks that every Multus network references a NAD that exists and
// whose config parses. A VM referencing a missing NAD is created fine by the
// API server and then fails at start with a pod event few users find.
type NADs struct{}

// Name implements chain.VMValidator.
func (NADs) Name() string { return "nads" }

// Validate implements chain.VMValidator.
func (NADs) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	nets, err := multusNetworks(ctx, req)
	if err != nil {
		return nil, err
	}
	var errs field.ErrorList
	for _, mn := range nets {
		p := req.NetworkPath(mn.netIndex).Child("multus", "networkName")
		ref := mn.net.Multus.NetworkName
		switch {
		case mn.badRef != nil:
			errs = append(errs, field.Invalid(p, ref, mn.badRef.Error()))
		case mn.nad == nil:
			errs = append(errs, field.NotFound(p, ref))
		case mn.nad.ConfigError != nil:
			errs = append(errs, field.Invalid(p, ref, fmt.Sprintf("NetworkAttachmentDefinition %s has an unusable %v", mn.nad.Ref(), mn.nad.ConfigError)))
		}
	}
	return errs, nil
}
