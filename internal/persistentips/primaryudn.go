package persistentips

import (
	"context"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
)

// PrimaryUDNInterface is primaryudn.Interface, the spec.interface of a
// primary-UDN claim.
const PrimaryUDNInterface = primaryudn.Interface

// DesiredPrimary is the claim for the pod network of owner o when the
// namespace's primary network is a user-defined network that keeps IPs and
// cfg turns primary-UDN persistent IPs on. The claim is named like a
// secondary network's, after the pod network ("<vm>.default"), as KubeVirt's
// ipam-extensions names it, so a cluster moving from one to the other keeps
// the same claim and IP.
func DesiredPrimary(ctx context.Context, cfg *config.Config, o Owner, spec *kubevirtv1.VirtualMachineInstanceSpec, facts lookup.Facts) (*WantedClaim, *Skipped, error) {
	if !cfg.PrimaryUDNEnabled() || cfg.Excluded(o.Namespace) {
		return nil, nil, nil
	}
	pod := primaryudn.PodNetwork(spec)
	if pod == nil {
		return nil, nil, nil
	}
	nads, err := facts.PrimaryNetworks(ctx, o.Namespace)
	if err != nil {
		return nil, nil, err
	}
	info, why := primaryudn.Primary(o.Namespace, nads)
	if info == nil {
		if why != "" {
			return nil, &Skipped{Network: pod.Name, Reason: why}, nil
		}
		return nil, nil, nil
	}
	if ok, why := primaryudn.Claimable(info); !ok {
		return nil, &Skipped{Network: pod.Name, Reason: why}, nil
	}
	c := NewClaim(o, pod.Name, info.NetworkName)
	c.Spec.Interface = PrimaryUDNInterface
	return &WantedClaim{Network: pod.Name, NAD: info, Claim: c}, nil, nil
}
