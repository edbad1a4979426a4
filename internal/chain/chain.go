// Package chain runs kvnet's mutators and validators over one decoded object.
// Mutators change the object in place, in a fixed order; the webhook computes
// a single JSON patch from the result, so no two mutators ever produce
// overlapping patches.
package chain

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Annotations kvnet reads and writes on VMs and VMIs.
const (
	// SkipAnnotation set to "true" on a VM or VMI opts it out of kvnet entirely.
	SkipAnnotation = "kvnet.io/skip"
	// MutationsAnnotation records what kvnet changed and why.
	MutationsAnnotation = "kvnet.io/mutations"
)

// VMMutator changes a VM or VMI in place. It must be idempotent: running it on
// its own output changes nothing. A mutator that changes the object must say
// so with Request.Record: the webhook computes a patch only for requests
// with recorded changes.
type VMMutator interface {
	Name() string
	Mutate(ctx context.Context, req *Request) error
}

// VMValidator checks a VM or VMI. It returns field errors for what must be
// refused and adds warnings to the request for what is only risky; an error
// means kvnet itself failed (a lookup), not the user.
type VMValidator interface {
	Name() string
	Validate(ctx context.Context, req *Request) (field.ErrorList, error)
}

// SkipReason says why kvnet leaves this object alone, or "" when it does not.
func SkipReason(req *Request) string {
	switch {
	case req.Meta.DeletionTimestamp != nil:
		// Updates of a terminating object remove finalizers; refusing or
		// growing them could leave the VM stuck in Terminating.
		return "object is being deleted"
	case req.Config.Excluded(req.Namespace):
		return "namespace is excluded by config"
	case req.Meta.Annotations[SkipAnnotation] == "true":
		return SkipAnnotation + " is true"
	}
	return ""
}
