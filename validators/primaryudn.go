package validators

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// PrimaryUDNCheck checks, on the VM, what the launcher-pod webhook would
// otherwise only find out when virt-controller creates the pod, where
// nobody reads its warnings and a refusal leaves the VM without a pod
// (persistentIPs.primaryUDN on, in a namespace whose primary network is an
// OVN-Kubernetes user-defined network):
//
//   - error: a template default-network annotation kvnet would have to
//     overwrite (the pod would be refused), and a network.kubevirt.io/addresses
//     that does not parse, asks for an IP outside the primary network, not
//     one IP per family of a dual-stack network, or other IPs than the VM's
//     existing claim holds (OVN-Kubernetes would fail the pod);
//   - warning: the primary network cannot keep IPs (not layer2, no
//     allowPersistentIPs, no name), or the namespace has two of them, or
//     nothing will carry the claim (legacyClaimAnnotation off and no
//     default-network NAD); the claim's name is not ipam-extensions'.
type PrimaryUDNCheck struct{}

// Name implements chain.VMValidator.
func (PrimaryUDNCheck) Name() string { return "primary-udn-requests" }

// Validate implements chain.VMValidator.
func (PrimaryUDNCheck) Validate(ctx context.Context, req *chain.Request) (field.ErrorList, error) {
	if !req.Config.PrimaryUDNEnabled() || req.Config.Excluded(req.Namespace) {
		return nil, nil
	}
	pod := primaryudn.PodNetwork(req.Spec)
	if pod == nil {
		return nil, nil
	}
	nads, err := req.Facts.PrimaryNetworks(ctx, req.Namespace)
	if err != nil {
		return nil, err
	}
	info, why := primaryudn.Primary(req.Namespace, nads)
	if info == nil {
		if why != "" {
			req.Warn("the pod network's IP will not persist: %s", why)
		}
		return nil, nil
	}
	if ok, why := primaryudn.Claimable(info); !ok {
		req.Warn("the pod network's IP will not persist: %s", why)
		return nil, nil
	}
	warnClaimName(req, pod.Name)
	defaultNAD := req.Config.PersistentIPs.PrimaryUDN.DefaultNetworkNAD
	if !req.Config.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation() {
		// Without the legacy annotation only the default-network element
		// carries the claim, and kvnet writes it only while its NAD exists.
		if nad, err := req.Facts.NAD(ctx, defaultNAD); err != nil {
			return nil, err
		} else if nad == nil {
			req.Warn("the pod network's IP will not persist: NetworkAttachmentDefinition %s does not exist (OVN-Kubernetes creates it with preconfigured UDN addresses enabled) and persistentIPs.primaryUDN.legacyClaimAnnotation is off, so nothing will carry the claim", defaultNAD)
		}
	}
	return checkPodAnnotations(ctx, req, pod.Name, info)
}

// checkPodAnnotations refuses what the template's annotations would make
// the launcher-pod webhook refuse or OVN-Kubernetes fail: addresses it
// cannot take, a default-network element or a legacy claim annotation that
// is not the one kvnet writes.
func checkPodAnnotations(ctx context.Context, req *chain.Request, podNet string, info *netattach.Info) (field.ErrorList, error) {
	annPath := req.TemplateMetaPath.Child("annotations")
	var ann map[string]string
	if req.TemplateMeta != nil {
		ann = req.TemplateMeta.Annotations
	}
	var errs field.ErrorList
	want, bad := primaryudn.Element(req.Spec, ann, podNet, persistentips.ClaimName(req.Name, podNet), info, req.Config.PersistentIPs.PrimaryUDN.DefaultNetworkNAD)
	if raw, ok := ann[primaryudn.AddressesAnnotation]; ok {
		problem := ""
		switch {
		case bad != nil:
			problem = bad.Error()
		case len(want.IPs) > 0:
			var err error
			if problem, err = claimHolds(ctx, req, want.Claim, want.IPs); err != nil {
				return nil, err
			}
		}
		if problem != "" {
			errs = append(errs, field.Invalid(annPath.Key(primaryudn.AddressesAnnotation), raw, fmt.Sprintf("pod network %s: %s", podNet, problem)))
		}
	}
	if cur, ok := ann[multus.DefaultNetworkAnnotation]; ok {
		if _, _, conflict := primaryudn.CompleteDefaultElement(cur, true, req.Namespace, want); conflict != "" {
			errs = append(errs, field.Forbidden(annPath.Key(multus.DefaultNetworkAnnotation), fmt.Sprintf(
				"kvnet keeps the pod network's IP on primary network %s through this annotation on the virt-launcher pod, and would refuse the pod: %s; remove it", info.Ref(), conflict)))
		}
	}
	if cur, ok := ann[primaryudn.LegacyClaimAnnotation]; ok && cur != want.Claim {
		errs = append(errs, field.Forbidden(annPath.Key(primaryudn.LegacyClaimAnnotation), fmt.Sprintf(
			"kvnet keeps the pod network's IP in IPAMClaim %q and would refuse a virt-launcher pod naming %q; remove it", want.Claim, cur)))
	}
	return errs, nil
}

// claimHolds refuses IPs that this VM's existing claim does not hold: the
// launcher pod would ask OVN-Kubernetes for them and fail. Only a claim
// this object controls counts (by UID, so not on CREATE: a claim of that
// name then belongs to an earlier VM being released, or to someone else).
// The claim comes from the informer cache; a failure to read it is kvnet's
// (err), a claim holding other IPs the user's: mismatch says what it holds.
func claimHolds(ctx context.Context, req *chain.Request, name string, ips []string) (mismatch string, err error) {
	if req.Meta.UID == "" {
		return "", nil
	}
	c, err := req.Facts.IPAMClaim(ctx, req.Namespace, name)
	if err != nil || c == nil {
		return "", err
	}
	if ref := metav1.GetControllerOf(c); ref == nil || ref.UID != req.Meta.UID {
		return "", nil
	}
	if held := primaryudn.ClaimHolds(c, ips); held != nil {
		return held.Error(), nil
	}
	return "", nil
}
