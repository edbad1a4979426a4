package chain_test

import (
	"reflect"
	"slices"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
)

// Pointers names every region, each once, for a VM (with its template's
// maps) and a VMI: the contract test and the patch both rely on it.
func TestPointersNameEveryRegion(t *testing.T) {
	vm := chain.ForVM(&kubevirtv1.VirtualMachine{Spec: kubevirtv1.VirtualMachineSpec{Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{}}})
	vmi := chain.ForVMI(&kubevirtv1.VirtualMachineInstance{})
	fields := reflect.TypeFor[chain.Regions]().NumField() - 1 // Maps is a list
	for name, c := range map[string]struct {
		req  *chain.Request
		maps int
	}{"vm": {vm, 4}, "vmi": {vmi, 2}} {
		rs := c.req.Regions()
		p := rs.Pointers()
		if len(rs.Maps) != c.maps || len(p) != c.maps+fields {
			t.Errorf("%s: %d maps and %d pointers, want %d and %d: %v", name, len(rs.Maps), len(p), c.maps, c.maps+fields, p)
		}
		sorted := slices.Clone(p)
		slices.Sort(sorted)
		if len(slices.Compact(sorted)) != len(p) {
			t.Errorf("%s: a pointer is listed twice: %v", name, p)
		}
	}
}
