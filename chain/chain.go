// Package chain runs kvnet's mutators and validators over one decoded object.
// Mutators change the object in place, in a fixed order; the webhook computes
// a single JSON patch from the result, so no two mutators ever produce
// overlapping patches.
package chain

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/lookup"
	"github.com/kvnet/kvnet/metrics"
	"github.com/kvnet/kvnet/netattach"
)

// Annotations kvnet reads and writes on VMs and VMIs.
const (
	// SkipAnnotation set to "true" on a VM or VMI opts it out of kvnet entirely.
	SkipAnnotation = "kvnet.io/skip"
	// NetworksAnnotation asks for networks, in Multus short form
	// ("ns/nad@name, nad2") or as a JSON list of {name, nad, binding, defaultRoute}.
	NetworksAnnotation = "kvnet.io/networks"
	// MutationsAnnotation records what kvnet changed and why.
	MutationsAnnotation = "kvnet.io/mutations"
)

// Kinds of objects the VM chain handles.
const (
	KindVM  = "VirtualMachine"
	KindVMI = "VirtualMachineInstance"
)

// Request is one VM or VMI under admission, with the facts around it.
type Request struct {
	Operation admissionv1.Operation
	Kind      string
	Namespace string
	Name      string
	// Meta is the object's own metadata: its labels select rules, its
	// annotations carry the opt-out and the mutation record.
	Meta *metav1.ObjectMeta
	// TemplateMeta is where annotations for the VMI and its pod belong:
	// spec.template.metadata of a VM, the metadata of a VMI. KubeVirt copies
	// them from VM to VMI to virt-launcher pod.
	TemplateMeta *metav1.ObjectMeta
	// Spec is the VMI spec: spec.template.spec of a VM, spec of a VMI.
	Spec *kubevirtv1.VirtualMachineInstanceSpec
	// SpecPath locates Spec for field errors.
	SpecPath *field.Path
	// TemplateMetaPath locates TemplateMeta for field errors.
	TemplateMetaPath *field.Path

	Config *config.Config
	Facts  lookup.Facts

	// DefaultRoute holds the networks that were asked to carry the default route.
	DefaultRoute map[string]bool
	// Changes is what the mutators did, for the kvnet.io/mutations annotation.
	Changes []Change
	// Warnings are returned to the client as admission warnings.
	Warnings []string

	nads map[string]*netattach.Info
}

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

// Warn adds an admission warning.
func (r *Request) Warn(format string, args ...any) {
	r.Warnings = append(r.Warnings, fmt.Sprintf(format, args...))
}

// Invalid builds the 422 a user gets, in the shape KubeVirt's virt-api uses:
// one cause per field.
func (r *Request) Invalid(errs field.ErrorList) error {
	return RefuseInvalid(schema.GroupKind{Group: kubevirtv1.GroupVersion.Group, Kind: r.Kind}, r.Name, errs)
}

// NetworkPath is the field path of spec.networks[i].
func (r *Request) NetworkPath(i int) *field.Path { return r.SpecPath.Child("networks").Index(i) }

// InterfacePath is the field path of spec.domain.devices.interfaces[i].
func (r *Request) InterfacePath(i int) *field.Path {
	return r.SpecPath.Child("domain", "devices", "interfaces").Index(i)
}

// NAD resolves a multus networkName ("ns/name" or "name") against the
// request's namespace. It returns nil info for a NAD that does not exist or a
// reference that is malformed (the NADs validator reports both to the user),
// and an error only when the lookup itself failed. Results are memoised for
// the request.
func (r *Request) NAD(ctx context.Context, networkName string) (*netattach.Info, error) {
	if info, ok := r.nads[networkName]; ok {
		return info, nil
	}
	ns, name, err := config.SplitNAD(networkName, r.Namespace)
	if err != nil {
		return nil, nil
	}
	info, err := r.Facts.NAD(ctx, ns, name)
	if err != nil {
		return nil, err
	}
	if r.nads == nil {
		r.nads = map[string]*netattach.Info{}
	}
	r.nads[networkName] = info
	return info, nil
}

// Kind classifies a NAD with the request's config.
func (r *Request) Classify(info *netattach.Info) netattach.Kind {
	return info.Classify(r.Config.SRIOV.ResourcePrefixes, r.Config.VDPA.ResourcePrefixes)
}

// MultusNetwork returns the network and its index by name, or -1.
func (r *Request) Network(name string) (int, *kubevirtv1.Network) {
	for i := range r.Spec.Networks {
		if r.Spec.Networks[i].Name == name {
			return i, &r.Spec.Networks[i]
		}
	}
	return -1, nil
}

// Interface returns the interface and its index by name, or -1.
func (r *Request) Interface(name string) (int, *kubevirtv1.Interface) {
	ifaces := r.Spec.Domain.Devices.Interfaces
	for i := range ifaces {
		if ifaces[i].Name == name {
			return i, &ifaces[i]
		}
	}
	return -1, nil
}

// Mutator changes a VM or VMI in place. It must be idempotent: running it on
// its own output changes nothing. A mutator that changes the object must say
// so with Request.Record: the webhook computes a patch only for requests
// with recorded changes.
type Mutator interface {
	Name() string
	Mutate(ctx context.Context, req *Request) error
}

// Validator checks a VM or VMI. It returns field errors for what must be
// refused and adds warnings to the request for what is only risky; an error
// means kvnet itself failed (a lookup), not the user.
type Validator interface {
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

// RunMutators runs ms in order. A panic in one becomes an error naming it.
func RunMutators(ctx context.Context, req *Request, ms []Mutator) error {
	for _, m := range ms {
		if err := runMutator(ctx, req, m); err != nil {
			return err
		}
	}
	return recordChanges(req)
}

func runMutator(ctx context.Context, req *Request, m Mutator) (err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			logf.FromContext(ctx).Error(fmt.Errorf("%v", p), "mutator panicked", "mutator", m.Name(), "stack", string(debug.Stack()))
			err = fmt.Errorf("mutator %s failed unexpectedly: %v", m.Name(), p)
		}
		metrics.ObserveStep(m.Name(), req.Kind, start, err, false)
	}()
	if err := m.Mutate(ctx, req); err != nil {
		return fmt.Errorf("mutator %s: %w", m.Name(), err)
	}
	return nil
}

// RunValidators runs every validator and joins their errors.
func RunValidators(ctx context.Context, req *Request, vs []Validator) (errs field.ErrorList, err error) {
	for _, v := range vs {
		e, verr := runValidator(ctx, req, v)
		if verr != nil {
			return nil, verr
		}
		errs = append(errs, e...)
	}
	return errs, nil
}

func runValidator(ctx context.Context, req *Request, v Validator) (errs field.ErrorList, err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			logf.FromContext(ctx).Error(fmt.Errorf("%v", p), "validator panicked", "validator", v.Name(), "stack", string(debug.Stack()))
			err = fmt.Errorf("validator %s failed unexpectedly: %v", v.Name(), p)
		}
		metrics.ObserveStep(v.Name(), req.Kind, start, err, len(errs) > 0)
	}()
	return v.Validate(ctx, req)
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
