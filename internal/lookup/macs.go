package lookup

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

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

// MACHolder is a VirtualMachine whose interface asks for a MAC.
type MACHolder struct {
	Namespace, Name, Interface string
}

// MACHolders implements Facts from the VirtualMachine informer's
// MACIndexField index (which the wiring registers). VMs being deleted
// hold nothing: their MACs are about to be free.
func (r *Reader) MACHolders(ctx context.Context, mac string) ([]MACHolder, error) {
	mac = CanonicalMAC(mac)
	if mac == "" {
		return nil, nil
	}
	var list kubevirtv1.VirtualMachineList
	if err := r.List(ctx, &list, client.MatchingFields{MACIndexField: mac}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the VirtualMachines with MAC %s: %w", mac, err)
	}
	return holders(list.Items, mac), nil
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
