package chain

import (
	"context"
	"fmt"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// Request is one VM or VMI under admission, with the facts around it.
type Request struct {
	Operation admissionv1.Operation
	Kind      Kind
	// Review is the admission request as the API server sent it, for a
	// step that calls a peer's webhook with it (mutators.MACPool); nil
	// where there is none (the offline CLI, benchmarks).
	Review    *admissionv1.AdmissionRequest
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

	// DefaultRoute holds the networks that were asked to carry the default
	// route (see MarkDefaultRoute), a handful at most.
	DefaultRoute []string
	// Changes is what the mutators did, for the kvnet.io/mutations annotation.
	Changes []Change
	// Warnings are returned to the client as admission warnings.
	Warnings []string

	// nads are the NADs looked up so far, by networkName: a few per
	// request, so a list rather than a map.
	nads []nadLookup
}

// MarkDefaultRoute notes that network was asked to carry the default route.
func (r *Request) MarkDefaultRoute(network string) {
	if !slices.Contains(r.DefaultRoute, network) {
		r.DefaultRoute = append(r.DefaultRoute, network)
	}
}

// CarriesDefaultRoute reports whether network was asked to carry the
// default route.
func (r *Request) CarriesDefaultRoute(network string) bool {
	return slices.Contains(r.DefaultRoute, network)
}

// Warn adds an admission warning.
func (r *Request) Warn(format string, args ...any) {
	r.Warnings = append(r.Warnings, fmt.Sprintf(format, args...))
}

// Invalid builds the 422 a user gets, in the shape KubeVirt's virt-api uses:
// one cause per field.
func (r *Request) Invalid(errs field.ErrorList) error {
	return RefuseInvalid(schema.GroupKind{Group: kubevirtv1.GroupVersion.Group, Kind: string(r.Kind)}, r.Name, errs)
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
	for _, l := range r.nads {
		if l.networkName == networkName {
			return l.info, nil
		}
	}
	ref, err := netattach.ParseRefIn(networkName, r.Namespace)
	if err != nil {
		return nil, nil
	}
	info, err := r.Facts.NAD(ctx, ref)
	if err != nil {
		return nil, err
	}
	if r.nads == nil {
		r.nads = make([]nadLookup, 0, 4)
	}
	r.nads = append(r.nads, nadLookup{networkName, info})
	return info, nil
}

type nadLookup struct {
	networkName string
	info        *netattach.Info
}

// Classify classifies a NAD with the request's config.
func (r *Request) Classify(info *netattach.Info) netattach.Kind {
	return info.Classify(r.Config.SRIOV.ResourcePrefixes, r.Config.VDPA.ResourcePrefixes)
}

// Network returns the network and its index by name, or -1.
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
