package lookup

import (
	"slices"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

// MemLockFeatureGate is the KubeVirt feature gate without which virt-api
// (v1.9.0) refuses spec.domain.memory.reservedOverhead.memLock on any VM or
// VMI: "Reserved overhead memlock feature gate is not enabled in
// kubevirt-config".
const MemLockFeatureGate = "ReservedOverheadMemlock"

// FeatureGate reports whether the KubeVirt CR enables gate: listed in
// spec.configuration.developerConfiguration.featureGates and not disabled.
// Without a CR nothing is known and it reports true, so that kvnet neither
// refuses nor holds back what it cannot check.
func FeatureGate(kv *kubevirtv1.KubeVirt, gate string) bool {
	if kv == nil {
		return true
	}
	dc := kv.Spec.Configuration.DeveloperConfiguration
	if dc == nil {
		return false
	}
	return slices.Contains(dc.FeatureGates, gate) && !slices.Contains(dc.DisabledFeatureGates, gate)
}
