package validators

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// VDPACheck refuses vDPA attachments that cannot start: a binding plugin the
// KubeVirt CR does not declare, or one that does not receive device-info
// (the sidecar learns the /dev/vhost-vdpa-N path from it), and memory that
// may not be locked although the device DMAs into it (memLock NotRequired,
// or a KubeVirt CR without the ReservedOverheadMemlock gate that virt-api
// requires for memLock). It warns that such a
// VM cannot live-migrate unless the plugin declares a migration method.
type VDPACheck struct{}

// Name implements chain.VMValidator.
func (VDPACheck) Name() string { return "vdpa-requirements" }

// Validate implements chain.VMValidator.
func (VDPACheck) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	nets, err := multusNetworks(ctx, req)
	if err != nil {
		return nil, err
	}
	var kv *kubevirtv1.KubeVirt
	kvRead := false
	var errs field.ErrorList
	anyVDPA := false
	for _, mn := range nets {
		if mn.nad == nil || mn.iface == nil || req.Classify(mn.nad) != netattach.KindVDPA || mn.iface.Binding == nil {
			continue // Binding reports non-plugin bindings on vDPA NADs
		}
		anyVDPA = true
		if !kvRead {
			if kv, err = req.Facts.KubeVirt(ctx); err != nil {
				return nil, err
			}
			kvRead = true
		}
		name := mn.iface.Binding.Name
		p := req.InterfacePath(mn.ifaceIndex).Child("binding", "name")
		if kv == nil {
			continue // Plugins warns that nothing could be checked
		}
		plugin, ok := declaredPlugin(kv, name)
		switch {
		case !ok:
			// Plugins refuses an undeclared plugin on any network.
		case plugin.DownwardAPI != kubevirtv1.DeviceInfo:
			errs = append(errs, field.Invalid(p, name, fmt.Sprintf(
				"binding plugin %q must set downwardAPI: device-info in KubeVirt %s/%s: the vDPA device path reaches the plugin only that way", name, kv.Namespace, kv.Name)))
		case plugin.Migration == nil:
			req.Warn("%s: binding plugin %q declares no migration method: this VM cannot be live-migrated", p.String(), name)
		}
	}
	if anyVDPA {
		p := req.SpecPath.Child("domain", "memory", "reservedOverhead", "memLock")
		var memLock *kubevirtv1.MemLockRequirement
		if m := req.Spec.Domain.Memory; m != nil && m.ReservedOverhead != nil {
			memLock = m.ReservedOverhead.MemLock
		}
		switch {
		case memLock != nil && *memLock == kubevirtv1.MemLockNotRequired:
			errs = append(errs, field.NotSupported(p, kubevirtv1.MemLockNotRequired, []kubevirtv1.MemLockRequirement{kubevirtv1.MemLockRequired}))
		case kv != nil && !lookup.FeatureGate(kv, lookup.MemLockFeatureGate):
			errs = append(errs, field.Required(p, fmt.Sprintf(
				"kvnet: a vDPA device needs locked guest memory (memLock: Required), which KubeVirt admits only with the feature gate %s: add it to spec.configuration.developerConfiguration.featureGates of KubeVirt %s/%s",
				lookup.MemLockFeatureGate, kv.Namespace, kv.Name)))
		}
	}
	return errs, nil
}
