package lookup

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MACIndexField is the informer-cache field index of VirtualMachines by the
// MACs their template's interfaces ask for (macAddress, in the canonical
// lower-case form): List with client.MatchingFields{MACIndexField: mac}.
const MACIndexField = "kvnet.io/interface-mac"

// InterfaceMACs are vm's values of MACIndexField: each interface MAC that
// parses, canonical (net.HardwareAddr's lower-case form), once.
func InterfaceMACs(vm *kubevirtv1.VirtualMachine) []string {
	if vm.Spec.Template == nil {
		return nil
	}
	var out []string
	for _, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
		if mac := CanonicalMAC(iface.MacAddress); mac != "" && !slices.Contains(out, mac) {
			out = append(out, mac)
		}
	}
	return out
}

// CanonicalMAC is mac in net.HardwareAddr's form ("02:00:00:00:00:0a"),
// or "" when it is not a 48-bit MAC.
func CanonicalMAC(mac string) string {
	hw, err := net.ParseMAC(mac)
	if err != nil || len(hw) != 6 {
		return ""
	}
	return hw.String()
}

// ClaimMACAnnotation is where kvnet keeps, on a receiving VM's IPAMClaim,
// the MAC of the network identity it received in a cross-cluster
// migration (persistentips.MACAnnotation): the guest keeps that MAC on the
// claim's network, whatever the VM's interface says.
const ClaimMACAnnotation = "kvnet.io/mac"

// ClaimMACIndexField is the informer-cache field index of IPAMClaims by
// ClaimMACAnnotation (canonical form).
const ClaimMACIndexField = "kvnet.io/claim-mac"

// ClaimMACs are claim's values of ClaimMACIndexField.
func ClaimMACs(claim *ipamv1alpha1.IPAMClaim) []string {
	if mac := CanonicalMAC(claim.Annotations[ClaimMACAnnotation]); mac != "" {
		return []string{mac}
	}
	return nil
}

// MACHolder is a VirtualMachine whose interface asks for a MAC, or that
// received it in a cross-cluster migration (Claim names the IPAMClaim that
// keeps it).
type MACHolder struct {
	Namespace, Name, Interface string
	Claim                      string
}

// IndexClaimMACs adds ClaimMACIndexField to the IPAMClaim informer of idx
// (before the manager starts, and only where the IPAMClaim CRD is
// installed): MACHolders then answers received MACs too.
func (r *Reader) IndexClaimMACs(ctx context.Context, idx client.FieldIndexer) error {
	err := idx.IndexField(ctx, &ipamv1alpha1.IPAMClaim{}, ClaimMACIndexField, func(o client.Object) []string {
		if c, ok := o.(*ipamv1alpha1.IPAMClaim); ok {
			return ClaimMACs(c)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("indexing IPAMClaims by received MAC: %w", err)
	}
	r.claimMACs = true
	return nil
}

// MACHolders implements Facts from the VirtualMachine informer's
// MACIndexField index and, where IndexClaimMACs added it, the IPAMClaim
// informer's ClaimMACIndexField (the wiring registers both). VMs and
// claims being deleted hold nothing: their MACs are about to be free.
func (r *Reader) MACHolders(ctx context.Context, mac string) ([]MACHolder, error) {
	mac = CanonicalMAC(mac)
	if mac == "" {
		return nil, nil
	}
	var list kubevirtv1.VirtualMachineList
	if err := r.List(ctx, &list, client.MatchingFields{MACIndexField: mac}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the VirtualMachines with MAC %s: %w", mac, err)
	}
	out := holders(list.Items, mac)
	if !r.claimMACs {
		return out, nil
	}
	var claims ipamv1alpha1.IPAMClaimList
	if err := r.List(ctx, &claims, client.MatchingFields{ClaimMACIndexField: mac}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the IPAMClaims with received MAC %s: %w", mac, err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		owner := metav1.GetControllerOf(c)
		if c.DeletionTimestamp != nil || owner == nil || owner.Kind != "VirtualMachine" {
			continue
		}
		out = append(out, MACHolder{Namespace: c.Namespace, Name: owner.Name, Interface: c.Spec.Interface, Claim: c.Name})
	}
	return out, nil
}

// MACHolders implements Facts.
func (s *Snapshot) MACHolders(_ context.Context, mac string) ([]MACHolder, error) {
	return holders(s.VMs, CanonicalMAC(mac)), nil
}

func holders(vms []kubevirtv1.VirtualMachine, mac string) []MACHolder {
	var out []MACHolder
	for i := range vms {
		vm := &vms[i]
		if vm.DeletionTimestamp != nil || vm.Spec.Template == nil || mac == "" {
			continue
		}
		for _, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
			if strings.EqualFold(CanonicalMAC(iface.MacAddress), mac) {
				out = append(out, MACHolder{Namespace: vm.Namespace, Name: vm.Name, Interface: iface.Name})
			}
		}
	}
	return out
}
