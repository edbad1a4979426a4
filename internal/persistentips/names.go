// Package persistentips keeps a VM's secondary-network IP addresses across
// stop/start and live migration. For every VM (or standalone VMI) network
// whose NetworkAttachmentDefinition allows persistent IPs, it ensures an
// IPAMClaim (k8s.cni.cncf.io/v1alpha1) that the IPAM plugin binds the
// address to; the virt-launcher pod then names that claim in its Multus
// selection element (see mutators.ClaimRefs). Claims live as long as the VM:
// a finalizer keeps them until the VM is being deleted, and the API server's
// garbage collector removes them through their owner reference.
package persistentips

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Names and keys this capability writes.
const (
	// Finalizer keeps a claim, and so its IP, while its VM exists. kvnet uses
	// its own finalizer, not KubeVirt's ipam-extensions one
	// (kubevirt.io/persistent-ipam), so each controller removes only what it
	// added and a claim is never released by the wrong one.
	Finalizer = "kvnet.io/persistent-ip"
	// VMLabel names the VM (or standalone VMI) a claim belongs to, as
	// KubeVirt's own tooling labels claims.
	VMLabel = "kubevirt.io/vm"
	// ConflictCondition is the condition kvnet sets on a claim that has the
	// name kvnet wanted but another owner, which kvnet will not adopt.
	ConflictCondition = "kvnet.io/NotAdopted"
)

// MaxClaimNameLength is the longest object name the API server accepts
// (an RFC 1123 subdomain).
const MaxClaimNameLength = validation.DNS1123SubdomainMaxLength

// hashSuffixLen is the number of hex characters of the name hash appended
// when a name must be shortened or rewritten.
const hashSuffixLen = 10

// ClaimName is the IPAMClaim name for network of VM (or standalone VMI) vm:
// "<vm>.<network>", lowercased. The same VM and network always give the same
// name, which is what makes the IP survive a stop/start: the new
// virt-launcher pod references the claim the old one used.
//
// When lowercasing changed the name (networks "Blue" and "blue" of one VM
// must not share a claim, and so an IP), when the lowercased name is not a
// valid RFC 1123 subdomain (a network name with "_" or other characters
// KubeVirt allows) or when it is longer than 253 characters, the invalid characters become "-", the name is cut so that
// "-" and the first 10 hex characters of sha256("<vm>.<network>") fit, and
// that suffix is appended: still deterministic, and two different inputs do
// not collide on a shared prefix.
func ClaimName(vm, network string) string {
	full := vm + "." + network
	lower := strings.ToLower(full)
	// Names that are already valid keep the plain form, so the claims of
	// existing VMs keep their names (and their IPs).
	if lower == full && len(validation.IsDNS1123Subdomain(lower)) == 0 {
		return lower
	}
	sum := sha256.Sum256([]byte(full))
	suffix := "-" + hex.EncodeToString(sum[:])[:hashSuffixLen]
	var b strings.Builder
	for _, r := range lower {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	prefix := b.String()
	if max := MaxClaimNameLength - len(suffix); len(prefix) > max {
		prefix = prefix[:max]
	}
	// Each dot-separated label must start and end alphanumeric; collapse
	// what the replacement and the cut may have left behind.
	labels := strings.Split(prefix, ".")
	kept := labels[:0]
	for _, l := range labels {
		if l = strings.Trim(l, "-"); l != "" {
			kept = append(kept, l)
		}
	}
	prefix = strings.Join(kept, ".")
	if prefix == "" {
		return "claim" + suffix
	}
	return prefix + suffix
}

// SameNameAsIPAMExtensions reports whether KubeVirt's ipam-extensions gives
// the claim of network of VM vm the name ClaimName gives it, so that a
// cluster moving from one to the other keeps the claim, and so the IP. It
// holds exactly when "<vm>.<network>" is already lowercase and a valid RFC
// 1123 subdomain of at most 253 characters: ClaimName then keeps it as it
// is, and ipam-extensions (pkg/claims ComposeKey: lowercase, then the
// valid lowercase runs joined by ".", cut at 253) finds nothing to change.
// Any other name gets kvnet's hash suffix, and ipam-extensions' name has
// none: the two name different claims.
func SameNameAsIPAMExtensions(vm, network string) bool {
	return ClaimName(vm, network) == vm+"."+network
}

// PodInterfaceName is the pod interface KubeVirt (v1.1 and later) gives a
// secondary network: "pod" and the first 11 hex characters of the sha256 of
// the VMI network name. It is what the launcher pod's selection element
// carries as "interface" and what the claim records as spec.interface.
func PodInterfaceName(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "pod" + hex.EncodeToString(sum[:])[:11]
}

// vmLabelValue returns the kubevirt.io/vm label value for name, or "" when
// name is too long to be a label value (VM names may be 253 characters,
// label values only 63): the owner reference remains the real link.
func vmLabelValue(name string) string {
	if len(validation.IsValidLabelValue(name)) > 0 {
		return ""
	}
	return name
}
