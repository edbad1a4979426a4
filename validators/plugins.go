package validators

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
)

// Plugins refuses an interface whose binding plugin the KubeVirt CR does not
// declare (spec.configuration.network.binding), on any network. KubeVirt
// v1.9.0's virt-api admits such a VM; virt-controller then cannot render its
// virt-launcher pod ("couldn't find configuration for network binding"), so
// the VM is stored, never starts, and says why only in a VMI condition. The
// real-KubeVirt tier (test/e2e) shows both halves.
//
// Without a visible KubeVirt CR nothing can be checked: a warning says so.
type Plugins struct{}

// Name implements chain.VMValidator.
func (Plugins) Name() string { return "binding-plugins" }

// Validate implements chain.VMValidator.
func (Plugins) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	var kv *kubevirtv1.KubeVirt
	read := false
	var errs field.ErrorList
	for i := range req.Spec.Domain.Devices.Interfaces {
		iface := &req.Spec.Domain.Devices.Interfaces[i]
		if iface.Binding == nil {
			continue
		}
		if !read {
			var err error
			if kv, err = req.Facts.KubeVirt(ctx); err != nil {
				return nil, fmt.Errorf("reading the KubeVirt CR to check binding plugins: %w", err)
			}
			read = true
		}
		p := req.InterfacePath(i).Child("binding", "name")
		if kv == nil {
			req.Warn("%s: no KubeVirt CR is visible to kvnet, so binding plugin %q was not checked", p.String(), iface.Binding.Name)
			continue
		}
		if _, ok := declaredPlugin(kv, iface.Binding.Name); !ok {
			errs = append(errs, field.Invalid(p, iface.Binding.Name, fmt.Sprintf("KubeVirt %s/%s declares no network binding plugin %q in spec.configuration.network.binding: the VM would be stored but never get a virt-launcher pod",
				kv.Namespace, kv.Name, iface.Binding.Name)))
		}
	}
	return errs, nil
}

// declaredPlugin looks a binding plugin up in the KubeVirt CR.
func declaredPlugin(kv *kubevirtv1.KubeVirt, name string) (kubevirtv1.InterfaceBindingPlugin, bool) {
	nc := kv.Spec.Configuration.NetworkConfiguration
	if nc == nil {
		return kubevirtv1.InterfaceBindingPlugin{}, false
	}
	p, ok := nc.Binding[name]
	return p, ok
}
