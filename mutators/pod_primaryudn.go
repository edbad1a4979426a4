package mutators

import (
	"context"
	"fmt"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// PrimaryUDNPod keeps the pod-network IP of VMs whose namespace's primary
// network is an OVN-Kubernetes user-defined network (persistentIPs.primaryUDN).
// The pod network is not in k8s.v1.cni.cncf.io/networks, so its claim goes
// into the launcher pod's v1.multus-cni.io/default-network element, with the
// MAC of the VM's pod interface and the IPs of network.kubevirt.io/addresses,
// and, for older OVN-Kubernetes, into k8s.ovn.org/primary-udn-ipamclaim
// (unless persistentIPs.primaryUDN.legacyClaimAnnotation is false).
//
// The element names the cluster default network's NAD (config
// defaultNetworkNAD), and Multus fails a pod whose element names a NAD that
// does not exist; OVN-Kubernetes creates that NAD only with preconfigured
// UDN addresses on. So the element is written only while the NAD is in the
// cache; without it the legacy annotation alone carries the claim, and a MAC
// or IPs the VM asks for are dropped with a warning.
//
// A default-network annotation already on the pod (from the VM template, or
// another webhook) is completed when it is the same element with none of
// kvnet's keys set to something else; otherwise the pod is refused (403)
// naming the annotation: overwriting it would change the pod's network
// behind its author's back, and leaving it would lose the VM's IP. The same
// holds for the legacy annotation. On UPDATE an annotation the request does
// not change is left alone: the pod's network is fixed at creation.
//
// Beside kubevirt/ipam-extensions, which writes both for the same claim,
// kvnet leaves them to it (see MutatePod).
type PrimaryUDNPod VMIReader

// Name implements chain.PodMutator.
func (PrimaryUDNPod) Name() string { return "primary-udn" }

// MutatePod implements chain.PodMutator: it finds the pod's VM on a
// claimable primary network, then references the claim (reference).
func (m PrimaryUDNPod) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	pod := req.Pod
	if !req.Config.PrimaryUDNEnabled() || pod.Annotations[chain.SkipAnnotation] == "true" {
		return nil
	}
	vmiName := pod.Annotations[kubevirtv1.DomainAnnotation]
	if vmiName == "" {
		return nil
	}
	// The namespace's NADs first: most namespaces have no primary network,
	// and then the VMI is not read at all.
	nads, err := req.Facts.PrimaryNetworks(ctx, req.Namespace)
	if err != nil {
		return err
	}
	info, why := primaryudn.Primary(req.Namespace, nads)
	if info == nil {
		if why != "" {
			req.Warn("the pod network's IP is not kept: %s", why)
		}
		return nil
	}
	if ok, why := primaryudn.Claimable(info); !ok {
		logf.FromContext(ctx).V(1).Info("no primary-UDN IPAMClaim", "reason", why)
		return nil
	}
	vmi, _, err := VMIReader(m).vmi(ctx, req.Namespace, vmiName, false)
	if err != nil || vmi == nil {
		return err
	}
	podNet := primaryudn.PodNetwork(&vmi.Spec)
	if podNet == nil {
		return nil
	}
	// ipam-extensions writes the same element and legacy annotation for
	// the same claim, and refuses a launcher pod created with a
	// default-network annotation already on it: were kvnet first to
	// write it, the VM would never start.
	if peer, err := req.Facts.IPAMExtensions(ctx); err != nil || peer != "" {
		if peer != "" {
			leaveClaimRefs(ctx, req, m.Name(), peer, []string{podNet.Name})
		}
		return err
	}
	return m.reference(ctx, req, vmi, podNet.Name, info)
}

// reference puts the claim of the pod network podNet of vmi, on primary
// network info, into the pod's legacy annotation and default-network
// element, with the MAC and the IPs the VM asks for.
func (m PrimaryUDNPod) reference(ctx context.Context, req *chain.PodRequest, vmi *kubevirtv1.VirtualMachineInstance, podNet string, info *netattach.Info) error {
	pod := req.Pod
	owner := persistentips.OwnerOf(vmi)
	claim := persistentips.ClaimName(owner.Name, podNet)
	var c ipamv1alpha1.IPAMClaim
	switch err := m.Cache.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: claim}, &c); {
	case apierrors.IsNotFound(err):
		// Not created yet: the controller creates it and OVN-Kubernetes waits.
	case err != nil:
		return fmt.Errorf("reading IPAMClaim %s/%s: %w", req.Namespace, claim, err)
	case !owner.Owns(&c):
		req.Warn("IPAMClaim %s is controlled by another object; the pod network of %s gets no persistent IP", claim, vmi.Name)
		return nil
	}
	defaultNAD := req.Config.PersistentIPs.PrimaryUDN.DefaultNetworkNAD
	want, err := primaryudn.Element(&vmi.Spec, vmi.Annotations, podNet, claim, info, defaultNAD)
	if err == nil && len(want.IPs) > 0 && c.Name != "" {
		err = primaryudn.ClaimHolds(&c, want.IPs)
	}
	if err != nil {
		req.Warn("%s on VMI %s is not applied to the pod network: %v", primaryudn.AddressesAnnotation, vmi.Name, err)
		want.IPs = nil
	}
	if err := m.legacy(req, claim); err != nil {
		return err
	}
	cur, present := pod.Annotations[multus.DefaultNetworkAnnotation]
	if present && unchangedOnUpdate(req, multus.DefaultNetworkAnnotation) {
		return nil
	}
	if !present {
		nad, err := req.Facts.NAD(ctx, defaultNAD)
		if err != nil {
			return err
		}
		if nad == nil {
			if !req.Config.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation() {
				req.Warn("the pod network's IP of %s is not kept: NetworkAttachmentDefinition %s, which %s must name, does not exist (OVN-Kubernetes creates it with preconfigured UDN addresses enabled), and persistentIPs.primaryUDN.legacyClaimAnnotation is off, so nothing carries IPAMClaim %s", vmi.Name, defaultNAD, multus.DefaultNetworkAnnotation, claim)
				return nil
			}
			if want.MAC != "" || len(want.IPs) > 0 {
				req.Warn("the MAC and IPs asked for on %s's pod network are not applied: NetworkAttachmentDefinition %s, which %s must name, does not exist (OVN-Kubernetes creates it with preconfigured UDN addresses enabled); the IP is kept through %s", vmi.Name, defaultNAD, multus.DefaultNetworkAnnotation, primaryudn.LegacyClaimAnnotation)
			}
			logf.FromContext(ctx).V(1).Info("default-network NAD not found; the primary-UDN claim goes through the legacy annotation only", "nad", defaultNAD.String())
			return nil
		}
	}
	out, changed, conflict := primaryudn.CompleteDefaultElement(cur, present, req.Namespace, want)
	if conflict != "" {
		return chain.RefuseForbidden(fmt.Sprintf("kvnet keeps the IP of %s on primary network %s through the pod's %s, but the pod already carries %s=%q: %s. Remove that annotation from the VM (template) or set it to what kvnet writes",
			vmi.Name, info.Ref(), multus.DefaultNetworkAnnotation, multus.DefaultNetworkAnnotation, cur, conflict))
	}
	if changed {
		pod.Annotations[multus.DefaultNetworkAnnotation] = out
		logf.FromContext(ctx).V(1).Info("primary-UDN IPAMClaim referenced", "claim", claim, "network", info.Ref(), "vmi", vmi.Name)
	}
	return nil
}

// legacy sets k8s.ovn.org/primary-udn-ipamclaim unless the config turns it
// off (persistentIPs.primaryUDN.legacyClaimAnnotation: OVN-Kubernetes plans
// to deprecate it), and refuses the pod when it already names another claim
// either way (OVN-Kubernetes releases that read only it would bind the IP
// to that claim, and current ones fall back to it).
func (PrimaryUDNPod) legacy(req *chain.PodRequest, claim string) error {
	cur, ok := req.Pod.Annotations[primaryudn.LegacyClaimAnnotation]
	switch {
	case !ok && !req.Config.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation():
	case !ok:
		req.Pod.Annotations[primaryudn.LegacyClaimAnnotation] = claim
	case cur == claim, unchangedOnUpdate(req, primaryudn.LegacyClaimAnnotation):
	default:
		return chain.RefuseForbidden(fmt.Sprintf("the pod carries %s=%q, but kvnet keeps the pod network's IP in IPAMClaim %q; remove the annotation from the VM (template)",
			primaryudn.LegacyClaimAnnotation, cur, claim))
	}
	return nil
}

// unchangedOnUpdate reports whether an UPDATE leaves annotation key as the
// stored pod has it.
func unchangedOnUpdate(req *chain.PodRequest, key string) bool {
	if req.Operation != admissionv1.Update || req.OldPod == nil {
		return false
	}
	old, ok := req.OldPod.Annotations[key]
	return ok && old == req.Pod.Annotations[key]
}
