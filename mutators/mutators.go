// Package mutators holds kvnet's VM/VMI mutators, one per file. Each is a
// pure function of the object, the looked-up cluster facts and the config,
// run by package chain in the order cmd/kvnet/app lists them (app.Chains).
package mutators

import (
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// hasBinding reports whether the user (or an earlier step) chose a binding.
func hasBinding(iface *kubevirtv1.Interface) bool {
	b := iface.InterfaceBindingMethod
	return b.Bridge != nil || b.Masquerade != nil || b.SRIOV != nil || b.PasstBinding != nil ||
		b.DeprecatedSlirp != nil || b.DeprecatedMacvtap != nil || b.DeprecatedPasst != nil || iface.Binding != nil
}
