package persistentips

import (
	"context"
	"encoding/json"
	"fmt"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/owner"
)

// Owner is the object a VM's claims belong to: the VirtualMachine, or the
// VirtualMachineInstance when it was created on its own.
type Owner struct {
	Kind      string // owner.KindVM or owner.KindVMI
	Namespace string
	Name      string
	UID       types.UID
}

// OwnerOf returns the claim owner for a VMI: its controlling VirtualMachine
// when it has one (then the VM and the VMI share a name), else the VMI.
func OwnerOf(vmi *kubevirtv1.VirtualMachineInstance) Owner {
	if ref := owner.ControllingVM(vmi); ref != nil {
		return Owner{Kind: owner.KindVM, Namespace: vmi.Namespace, Name: ref.Name, UID: ref.UID}
	}
	return Owner{Kind: owner.KindVMI, Namespace: vmi.Namespace, Name: vmi.Name, UID: vmi.UID}
}

// Ref is the controller owner reference a claim of o carries.
// BlockOwnerDeletion makes a foreground deletion of the VM wait for the claim.
func (o Owner) Ref() metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         kubevirtv1.SchemeGroupVersion.String(),
		Kind:               o.Kind,
		Name:               o.Name,
		UID:                o.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

// Owns reports whether claim is controlled by o: same kind, name and UID.
// A claim controlled by anything else is never adopted.
func (o Owner) Owns(claim *ipamv1alpha1.IPAMClaim) bool {
	ref := metav1.GetControllerOf(claim)
	return ref != nil && ref.Kind == o.Kind && ref.Name == o.Name && ref.UID == o.UID
}

// WantedClaim is one claim a VM should have, with the network it is for.
type WantedClaim struct {
	// Network is the VMI network (spec.networks[].name).
	Network string
	// NAD is the resolved NetworkAttachmentDefinition.
	NAD   *netattach.Info
	Claim *ipamv1alpha1.IPAMClaim
}

// Skipped says why a network that might have wanted a claim gets none.
type Skipped struct {
	Network string
	Reason  string
}

// Claimable reports whether a NAD's IPs can be claimed, and why not.
func Claimable(info *netattach.Info) (bool, string) {
	switch {
	case info == nil:
		return false, "NetworkAttachmentDefinition not found"
	case info.ConfigError != nil:
		return false, info.ConfigError.Error()
	case !info.AllowPersistentIPs:
		return false, ""
	case info.NetworkName == "":
		return false, fmt.Sprintf("NetworkAttachmentDefinition %s allows persistent IPs but its config has no \"name\" for the claim's spec.network", info.Ref())
	}
	return true, ""
}

// Desired computes the claims owner o needs for the networks of spec: one
// per secondary Multus network whose NAD allows persistent IPs and, with
// persistentIPs.primaryUDN on, one for the pod network on a primary
// user-defined network (DesiredPrimary). It is a pure function of the spec,
// the config and the NAD facts, shared by the controller and the offline
// CLI. A missing NAD only skips its own network.
func Desired(ctx context.Context, cfg *config.Config, o Owner, spec *kubevirtv1.VirtualMachineInstanceSpec, facts lookup.Facts) (want []WantedClaim, skipped []Skipped, err error) {
	w, s, err := DesiredPrimary(ctx, cfg, o, spec, facts)
	if err != nil {
		return nil, nil, err
	}
	if w != nil {
		want = append(want, *w)
	}
	if s != nil {
		skipped = append(skipped, *s)
	}
	for _, net := range spec.Networks {
		if net.Multus == nil || net.Multus.Default {
			// The pod network and a Multus default network are the pod's
			// primary interface: not in the selection annotation.
			continue
		}
		ref, err := netattach.ParseRefIn(net.Multus.NetworkName, o.Namespace)
		if err != nil {
			skipped = append(skipped, Skipped{Network: net.Name, Reason: err.Error()})
			continue
		}
		info, err := facts.NAD(ctx, ref)
		if err != nil {
			return nil, nil, err
		}
		ok, why := Claimable(info)
		if !ok {
			if why != "" {
				skipped = append(skipped, Skipped{Network: net.Name, Reason: why})
			}
			continue
		}
		want = append(want, WantedClaim{Network: net.Name, NAD: info, Claim: NewClaim(o, net.Name, info.NetworkName)})
	}
	return want, skipped, nil
}

// NewClaim builds the claim of owner o for one VMI network on the network
// called networkName in the NAD config.
func NewClaim(o Owner, network, networkName string) *ipamv1alpha1.IPAMClaim {
	c := &ipamv1alpha1.IPAMClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: ipamv1alpha1.SchemeGroupVersion.String(), Kind: "IPAMClaim"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       o.Namespace,
			Name:            ClaimName(o.Name, network),
			OwnerReferences: []metav1.OwnerReference{o.Ref()},
			Finalizers:      []string{Finalizer},
		},
		Spec: ipamv1alpha1.IPAMClaimSpec{Network: networkName, Interface: PodInterfaceName(network)},
	}
	if v := vmLabelValue(o.Name); v != "" {
		c.Labels = map[string]string{VMLabel: v}
	}
	return c
}

// Offline returns, as JSON, the claims kvnet's controller would create for
// an admitted VM or standalone VMI (raw JSON of kind in namespace), for the
// offline CLI. A VMI started by a VM gets none: the VM's claims cover it.
func Offline(ctx context.Context, cfg *config.Config, facts lookup.Facts, kind, namespace string, raw []byte) ([][]byte, error) {
	if !cfg.PersistentIPsEnabled() || cfg.Excluded(namespace) {
		return nil, nil
	}
	var o Owner
	var spec *kubevirtv1.VirtualMachineInstanceSpec
	switch kind {
	case owner.KindVM:
		var vm kubevirtv1.VirtualMachine
		if err := json.Unmarshal(raw, &vm); err != nil {
			return nil, fmt.Errorf("decoding VirtualMachine: %w", err)
		}
		if vm.Spec.Template == nil {
			return nil, nil
		}
		o, spec = Owner{Kind: kind, Namespace: namespace, Name: vm.Name, UID: vm.UID}, &vm.Spec.Template.Spec
	case owner.KindVMI:
		var vmi kubevirtv1.VirtualMachineInstance
		if err := json.Unmarshal(raw, &vmi); err != nil {
			return nil, fmt.Errorf("decoding VirtualMachineInstance: %w", err)
		}
		vmi.Namespace = namespace
		if o = OwnerOf(&vmi); o.Kind != kind {
			return nil, nil
		}
		spec = &vmi.Spec
	default:
		return nil, nil
	}
	want, _, err := Desired(ctx, cfg, o, spec, facts)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, w := range want {
		b, err := json.Marshal(w.Claim)
		if err != nil {
			return nil, fmt.Errorf("encoding IPAMClaim %s: %w", w.Claim.Name, err)
		}
		// A claim is created without status (the IPAM plugin writes it);
		// the Go type has no omitempty on it.
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		delete(m, "status")
		if b, err = json.Marshal(m); err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
