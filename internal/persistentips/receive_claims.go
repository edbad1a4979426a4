package persistentips

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/model/multus"
)

// listPage bounds each uncached list of the held check: the whole cluster's
// claims and pods are read once per received identity, page by page.
const listPage = 500

// held refuses an IP that a claim or a pod of this cluster already holds
// on the same network. OVN-Kubernetes would not notice: it takes a
// populated claim's IPs without checking that nobody else has them, so
// two pods would answer for one address. A claim counts by its
// spec.network; a pod by the network of each NAD its network-status
// lists (a NAD that no longer exists counts as that network: kvnet
// cannot tell, and a refused migration is cheaper than a duplicate). The
// receiving VM's own claims do not count.
func (r *Receiver) held(ctx context.Context, owner Owner, plans []plannedClaim) error {
	want := map[netip.Addr]plannedClaim{}
	for _, p := range plans {
		for _, ip := range p.sent.IPs {
			want[ip.Addr()] = p
		}
	}
	if len(want) == 0 {
		return nil
	}
	// network "" is any network (a pod's NAD that is gone).
	heldBy := func(addr netip.Addr, network, by string) error {
		if p, ok := want[addr]; ok && (network == "" || p.nad.NetworkName == network) {
			return mismatch(ReasonHeld, "networks[%s].ips: %v is already held on network %q by %s", p.sent.Name, addr, network, by)
		}
		return nil
	}
	var claims ipamv1alpha1.IPAMClaimList
	for opts := (&client.ListOptions{Limit: listPage}); ; opts.Continue = claims.Continue {
		if err := r.Reader.List(ctx, &claims, opts); err != nil {
			return fmt.Errorf("listing IPAMClaims: %w", err)
		}
		for i := range claims.Items {
			c := &claims.Items[i]
			if owner.Owns(c) && c.Namespace == owner.Namespace {
				continue
			}
			for _, ip := range c.Status.IPs {
				if p, err := netip.ParsePrefix(ip); err == nil {
					if err := heldBy(p.Addr(), c.Spec.Network, "IPAMClaim "+c.Namespace+"/"+c.Name); err != nil {
						return err
					}
				}
			}
		}
		if claims.Continue == "" {
			break
		}
	}
	return r.heldByPods(ctx, heldBy)
}

// heldByPods applies heldBy to each address of each pod that has not
// finished, on the network of the NAD it was attached through.
func (r *Receiver) heldByPods(ctx context.Context, heldBy func(addr netip.Addr, network, by string) error) error {
	var pods corev1.PodList
	for opts := (&client.ListOptions{Limit: listPage}); ; opts.Continue = pods.Continue {
		if err := r.Reader.List(ctx, &pods, opts); err != nil {
			return fmt.Errorf("listing pods: %w", err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			raw := p.Annotations[multus.NetworkStatusAnnotation]
			if raw == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue
			}
			statuses, err := multus.ParseNetworkStatus(raw)
			if err != nil {
				r.Log.V(1).Info("skipping a pod whose network-status does not parse", "pod", p.Namespace+"/"+p.Name, "error", err.Error())
				continue
			}
			for _, s := range statuses {
				if s.Default {
					continue // the cluster default network is not a secondary network's
				}
				ns, name := s.NAD(p.Namespace)
				info, err := r.Facts.NAD(ctx, ns, name)
				if err != nil {
					return fmt.Errorf("reading NetworkAttachmentDefinition %s/%s: %w", ns, name, err)
				}
				network, by := "", "pod "+p.Namespace+"/"+p.Name+" (its NetworkAttachmentDefinition "+ns+"/"+name+" is gone)"
				if info != nil {
					network, by = info.NetworkName, "pod "+p.Namespace+"/"+p.Name
				}
				for _, a := range s.Addrs() {
					if err := heldBy(a, network, by); err != nil {
						return err
					}
				}
			}
		}
		if pods.Continue == "" {
			return nil
		}
	}
}

// write makes the receiving VM's claim for one network exist, as the
// controller creates it, with the source's MAC annotated and its IPs in
// status. The claim's status is a subresource: created first, then
// written. A claim that already holds other IPs, or that another object
// controls, is refused rather than overwritten.
func (r *Receiver) write(ctx context.Context, owner Owner, p plannedClaim) error {
	want := p.claim.DeepCopy()
	if len(p.sent.MAC) > 0 {
		want.Annotations = map[string]string{MACAnnotation: p.sent.MAC.String()}
	}
	var cur ipamv1alpha1.IPAMClaim
	err := r.Reader.Get(ctx, client.ObjectKeyFromObject(want), &cur)
	if apierrors.IsNotFound(err) {
		cur = *want.DeepCopy()
		if err = r.Client.Create(ctx, &cur); err == nil {
			claimsCreated.Inc()
		} else if apierrors.IsAlreadyExists(err) {
			// The controller created it meanwhile.
			err = r.Reader.Get(ctx, client.ObjectKeyFromObject(want), &cur)
		}
	}
	if err != nil {
		return fmt.Errorf("writing IPAMClaim %s/%s: %w", want.Namespace, want.Name, err)
	}
	ips := make([]string, 0, len(p.sent.IPs))
	for _, ip := range p.sent.IPs {
		ips = append(ips, ip.String())
	}
	switch {
	case !owner.Owns(&cur):
		return mismatch(ReasonClaim, "networks[%s]: IPAMClaim %s here is not the receiving VM's", p.sent.Name, cur.Name)
	case cur.DeletionTimestamp != nil:
		return mismatch(ReasonClaim, "networks[%s]: IPAMClaim %s here is being deleted", p.sent.Name, cur.Name)
	case len(cur.Status.IPs) > 0 && !slices.Equal(cur.Status.IPs, ips):
		return mismatch(ReasonClaim, "networks[%s].ips: IPAMClaim %s here already holds %v", p.sent.Name, cur.Name, cur.Status.IPs)
	}
	if mac := want.Annotations[MACAnnotation]; mac != "" && cur.Annotations[MACAnnotation] != mac {
		base := cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[MACAnnotation] = mac
		if err := r.Client.Patch(ctx, &cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("annotating IPAMClaim %s/%s with the source's MAC: %w", cur.Namespace, cur.Name, err)
		}
	}
	if len(cur.Status.IPs) > 0 {
		return nil // this identity was stored before
	}
	cur.Status.IPs = ips
	if err := r.Client.Status().Update(ctx, &cur); err != nil {
		return fmt.Errorf("writing the source's IPs into IPAMClaim %s/%s status: %w", cur.Namespace, cur.Name, err)
	}
	return nil
}
