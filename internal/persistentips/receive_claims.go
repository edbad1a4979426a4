package persistentips

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// listPage bounds each uncached list of the held check: the whole cluster's
// claims and pods are read once per received identity, page by page.
const listPage = 500

// held refuses an IP that a claim or a pod of this cluster already holds
// on the same network. OVN-Kubernetes would not notice: it takes a
// populated claim's IPs without checking that nobody else has them, so
// two pods would answer for one address. A claim counts by its
// spec.network; a pod by the network of each NAD its network-status
// lists (heldByPods). The receiving VM's own claims do not count.
//
// The refusal, which becomes an event on the receiving VMIM and travels
// back to the source, names a holder of the receiving VM's namespace but
// not one of another namespace ("an IPAMClaim in another namespace"):
// the namespace's users see the event, and another tenant's objects are
// not theirs to learn. The log line (Mismatch.Holder) names it for the
// cluster admin.
func (r *Receiver) held(ctx context.Context, owner Owner, plans []plannedClaim) error {
	want := map[netip.Addr]plannedClaim{}
	wantMAC := map[string]plannedClaim{}
	for _, p := range plans {
		for _, ip := range p.sent.IPs {
			want[ip.Addr()] = p
		}
		if len(p.sent.MAC) > 0 {
			wantMAC[p.sent.MAC.String()] = p
		}
	}
	if len(want) == 0 && len(wantMAC) == 0 {
		return nil
	}
	name := func(kind, namespace, name string) (holder, said string) {
		holder = kind + " " + namespace + "/" + name
		if namespace == owner.Namespace {
			return holder, holder
		}
		if kind == "IPAMClaim" {
			return holder, "an IPAMClaim in another namespace"
		}
		return holder, "a " + kind + " in another namespace"
	}
	macHeldBy := func(mac, kind, namespace, n string) error {
		hw, err := net.ParseMAC(mac)
		if err != nil {
			return nil
		}
		p, ok := wantMAC[hw.String()]
		if !ok {
			return nil
		}
		holder, said := name(kind, namespace, n)
		return &Mismatch{Reason: ReasonHeld, Holder: holder,
			Err: fmt.Errorf("networks[%s].mac: %v is already used by %s", p.sent.Name, hw, said)}
	}
	heldBy := func(addr netip.Addr, network, kind, namespace, n string) error {
		p, ok := want[addr]
		if !ok || p.nad.NetworkName != network {
			return nil
		}
		holder, said := name(kind, namespace, n)
		return &Mismatch{Reason: ReasonHeld, Holder: holder,
			Err: fmt.Errorf("networks[%s].ips: %v is already held on network %q by %s", p.sent.Name, addr, network, said)}
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
					if err := heldBy(p.Addr(), c.Spec.Network, "IPAMClaim", c.Namespace, c.Name); err != nil {
						return err
					}
				}
			}
			if err := macHeldBy(c.Annotations[MACAnnotation], "IPAMClaim", c.Namespace, c.Name); err != nil {
				return err
			}
		}
		if claims.Continue == "" {
			break
		}
	}
	if len(wantMAC) > 0 {
		if err := r.macsHeldByVMIs(ctx, owner, macHeldBy); err != nil {
			return err
		}
	}
	return r.heldByPods(ctx, heldBy)
}

// macsHeldByVMIs applies macHeldBy to each MAC a VMI other than the
// receiving one asks for (spec.domain.devices.interfaces[].macAddress) or
// reports (status.interfaces[].mac): two guests with one MAC on a network
// break each other's traffic, and kubemacpool, where it runs, would not
// know of a MAC that came from another cluster.
func (r *Receiver) macsHeldByVMIs(ctx context.Context, owner Owner, macHeldBy func(mac, kind, namespace, name string) error) error {
	var vmis kubevirtv1.VirtualMachineInstanceList
	for opts := (&client.ListOptions{Limit: listPage}); ; opts.Continue = vmis.Continue {
		if err := r.Reader.List(ctx, &vmis, opts); err != nil {
			return fmt.Errorf("listing VirtualMachineInstances: %w", err)
		}
		for i := range vmis.Items {
			v := &vmis.Items[i]
			if v.Namespace == owner.Namespace && v.Name == owner.Name {
				continue
			}
			for _, iface := range v.Spec.Domain.Devices.Interfaces {
				if err := macHeldBy(iface.MacAddress, "VirtualMachineInstance", v.Namespace, v.Name); err != nil {
					return err
				}
			}
			for _, iface := range v.Status.Interfaces {
				if err := macHeldBy(iface.MAC, "VirtualMachineInstance", v.Namespace, v.Name); err != nil {
					return err
				}
			}
		}
		if vmis.Continue == "" {
			return nil
		}
	}
}

// MaxNetworkStatusEntries bounds the network-status entries of one pod
// that the held check reads: a pod's annotation is whatever whoever may
// write the pod wrote, and KubeVirt's launcher pods carry one entry per
// interface (a handful).
const MaxNetworkStatusEntries = 32

// heldByPods applies heldBy to each address of each pod that has not
// finished, on the network of the NAD it was attached through. The
// network-status annotation is written by Multus, but anyone who may
// update a pod may write it too, so an entry counts only for a NAD that
// the pod asked for in its networks annotation (Multus attaches no other)
// and that exists (its network is then known), and only the first
// MaxNetworkStatusEntries entries count. A tenant cannot then claim a
// whole subnet, or every network, from its own pod; what it can still
// claim is addresses on networks its pod really attaches to, which would
// be a duplicate anyway. The NADs come from Facts, a cache.
func (r *Receiver) heldByPods(ctx context.Context, heldBy func(addr netip.Addr, network, kind, namespace, name string) error) error {
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
			requested, err := multus.Parse(p.Annotations[multus.NetworksAnnotation])
			if err != nil {
				r.Log.V(1).Info("skipping a pod whose networks annotation does not parse", "pod", p.Namespace+"/"+p.Name, "error", err.Error())
				continue
			}
			if len(statuses) > MaxNetworkStatusEntries {
				r.Log.V(1).Info("reading only the first network-status entries of a pod", "pod", p.Namespace+"/"+p.Name, "entries", len(statuses), "read", MaxNetworkStatusEntries)
				statuses = statuses[:MaxNetworkStatusEntries]
			}
			for _, s := range statuses {
				if s.Default {
					continue // the cluster default network is not a secondary network's
				}
				ns, name := s.NAD(p.Namespace)
				if !slices.ContainsFunc(requested, func(e *multus.Element) bool { return e.Refers(p.Namespace, ns, name) }) {
					continue
				}
				info, err := r.Facts.NAD(ctx, netattach.Ref{Namespace: ns, Name: name})
				if err != nil {
					return fmt.Errorf("reading NetworkAttachmentDefinition %s/%s: %w", ns, name, err)
				}
				if info == nil {
					continue
				}
				for _, a := range s.Addrs() {
					if err := heldBy(a, info.NetworkName, "pod", p.Namespace, p.Name); err != nil {
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
