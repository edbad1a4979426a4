package mutators

import (
	"context"
	"maps"
	"slices"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// KeyCNIArgs is the Multus selection-element key for per-attachment CNI args.
const KeyCNIArgs = "cni-args"

// AddressesPod writes the kvnet.io/addresses requests (copied by KubeVirt
// from the VMI to its launcher pod) into the networks' Multus selection
// elements as "ips", "mac" and "cni-args", keeping every other key.
//
// It finds a network's element by the pod interface KubeVirt names after the
// network, so it needs no VMI read; an element without that interface (a
// KubeVirt older than v1.1) gets nothing and a warning. It runs before
// ClaimRefs, which then leaves an element with "ips" without a claim
// reference: Multus refuses both, and an explicit address already persists.
// A key already on the element (another webhook's choice) is kept.
type AddressesPod struct{}

// Name implements chain.PodMutator.
func (AddressesPod) Name() string { return "addresses-pod" }

// MutatePod implements chain.PodMutator.
func (AddressesPod) MutatePod(_ context.Context, req *chain.PodRequest) error {
	v, ok := req.Pod.Annotations[addresses.Annotation]
	if !ok || req.Pod.Annotations[chain.SkipAnnotation] == "true" {
		return nil
	}
	table, err := addresses.Parse(v)
	if err != nil {
		// The VM validator refuses a malformed value; one set on the pod
		// directly is not a reason to keep a VM from starting.
		req.Warn("kvnet ignores %s: %v", addresses.Annotation, err)
		return nil
	}
	elems, err := multus.Parse(req.Pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		req.Warn("kvnet cannot read %s, so no address request is applied: %v", multus.NetworksAnnotation, err)
		return nil
	}
	byIface := make(map[string]*multus.Element, len(elems))
	for _, e := range elems {
		byIface[e.Interface()] = e
	}
	changed := false
	for _, network := range slices.Sorted(maps.Keys(table)) {
		r := table[network]
		e := byIface[persistentips.PodInterfaceName(network)]
		if e == nil {
			req.Warn("network %s: no selection element with interface %s in %s; its address request is not applied", network, persistentips.PodInterfaceName(network), multus.NetworksAnnotation)
			continue
		}
		if len(r.IPs) > 0 && !e.Has(multus.KeyIPs) {
			if err := e.Set(multus.KeyIPs, r.IPs); err != nil {
				return err
			}
			changed = true
		}
		if r.MAC != "" && !e.Has(multus.KeyMAC) {
			e.SetString(multus.KeyMAC, r.MAC)
			changed = true
		}
		if len(r.CNIArgs) > 0 && !e.Has(KeyCNIArgs) {
			if err := e.Set(KeyCNIArgs, r.CNIArgs); err != nil {
				return err
			}
			changed = true
		}
	}
	if !changed {
		return nil
	}
	out, err := multus.Format(elems)
	if err != nil {
		return err
	}
	req.Pod.Annotations[multus.NetworksAnnotation] = out
	return nil
}
