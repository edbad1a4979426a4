package mutators

import (
	"context"
	"fmt"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// ClaimRefs adds "ipam-claim-reference" to the virt-launcher pod's Multus
// selection elements of networks whose NAD allows persistent IPs, naming the
// IPAMClaim the persistentips controller keeps for the VM. The IPAM plugin
// then gives the pod the claim's address, so a restarted or migrated VM
// keeps its IP.
//
// It runs on pod CREATE and UPDATE (KubeVirt rewrites the annotation for NIC
// hotplug) and is idempotent. It reads the VMI and the claims from informer
// caches; only a VMI the cache does not have yet (the pod can be admitted
// before the VMI informer catches up), or whose cached copy lacks a network
// the pod names (a hotplug the informer has not delivered), is read from the
// API server, once, instead of sleeping and retrying.
//
// The reference is added by name even when the claim is not in the cache
// yet: the controller creates it right after the VM, and the IPAM plugin
// waits for it, whereas a pod created without the reference would lose the
// persistent IP for its whole life. A claim that exists but is controlled by
// another object is never referenced.
//
// An element that already carries "ips" is left alone with a warning: the
// user (or another webhook) pinned the address explicitly, and Multus
// refuses an element with both keys. Refusing the pod instead would make the
// VM unable to start over a choice that already keeps its IP.
type ClaimRefs VMIReader

// VMIReader is what the launcher-pod mutators read a pod's VMI with.
type VMIReader struct {
	// Cache reads VMIs and IPAMClaims; informer-backed.
	Cache client.Reader
	// API reads a VMI the cache does not have yet; uncached.
	API client.Reader
}

// Name implements chain.PodMutator.
func (ClaimRefs) Name() string { return "claim-refs" }

// MutatePod implements chain.PodMutator.
func (m ClaimRefs) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	pod := req.Pod
	if !req.Config.PersistentIPsEnabled() || pod.Annotations[chain.SkipAnnotation] == "true" {
		return nil
	}
	vmiName := pod.Annotations[kubevirtv1.DomainAnnotation]
	raw := pod.Annotations[multus.NetworksAnnotation]
	if vmiName == "" || raw == "" {
		return nil
	}
	elems, err := multus.Parse(raw)
	if err != nil {
		// The pod is KubeVirt's; a broken annotation is Multus' to refuse.
		req.Warn("kvnet cannot read %s, so no IPAMClaim is referenced: %v", multus.NetworksAnnotation, err)
		return nil
	}
	vmi, cached, err := VMIReader(m).vmi(ctx, req.Namespace, vmiName, false)
	if err != nil || vmi == nil {
		return err
	}
	byIface, byOrdinal := interfaceIndex(vmi.Spec.Networks)
	if cached && unknownInterface(elems, byIface, byOrdinal) && m.API != nil {
		// NIC hotplug: KubeVirt adds the network to the VMI, then rewrites
		// the pod annotation; the cache may not have the new VMI yet.
		if vmi, _, err = VMIReader(m).vmi(ctx, req.Namespace, vmiName, true); err != nil || vmi == nil {
			return err
		}
		byIface, byOrdinal = interfaceIndex(vmi.Spec.Networks)
	}
	// Beside kubevirt/ipam-extensions, whose webhook references the same
	// claims (by the same names) on the same pods, kvnet leaves the
	// references to it rather than race it in either webhook order.
	peer, err := req.Facts.IPAMExtensions(ctx)
	if err != nil {
		return err
	}
	owner := persistentips.OwnerOf(vmi)
	changed := false
	var left []string
	for i, e := range elems {
		net := matchNetwork(req.Namespace, e, vmi.Spec.Networks, byIface, byOrdinal)
		if net == nil {
			continue
		}
		claim, err := m.claimFor(ctx, req, owner, e, net)
		switch {
		case err != nil:
			return fmt.Errorf("%s element %d (%s): %w", multus.NetworksAnnotation, i, e.Name(), err)
		case claim == "":
		case peer != "":
			left = append(left, net.Name)
		case e.String(multus.KeyIPAMClaimReference) != claim:
			e.SetString(multus.KeyIPAMClaimReference, claim)
			changed = true
		}
	}
	if len(left) > 0 {
		leaveClaimRefs(ctx, req, m.Name(), peer, left)
	}
	if !changed {
		return nil
	}
	out, err := multus.Format(elems)
	if err != nil {
		return err
	}
	pod.Annotations[multus.NetworksAnnotation] = out
	return nil
}

// claimFor is the claim one element should reference, when its network
// has a claim kvnet may use and the element references no other (or ""):
// the element may already reference it.
func (m ClaimRefs) claimFor(ctx context.Context, req *chain.PodRequest, owner persistentips.Owner, e *multus.Element, net *kubevirtv1.Network) (string, error) {
	ref, err := netattach.ParseRefIn(net.Multus.NetworkName, req.Namespace)
	if err != nil {
		return "", nil // the VM validator reports malformed references
	}
	info, err := req.Facts.NAD(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("reading the NAD of network %s: %w", net.Name, err)
	}
	if ok, why := persistentips.Claimable(info); !ok {
		if why != "" {
			// A missing NAD only costs its own network the reference.
			logf.FromContext(ctx).V(1).Info("no IPAMClaim reference", "network", net.Name, "reason", why)
		}
		return "", nil
	}
	claim := persistentips.ClaimName(owner.Name, net.Name)
	// An element without a reference, or with "" or null (none, to Multus
	// as well), gets the claim; one with a value that is not a string is
	// left as it is, for Multus to refuse: kvnet does not repair it.
	switch cur, ok := e.OptionalString(multus.KeyIPAMClaimReference); {
	case !ok:
		req.Warn("network %s has an ipam-claim-reference that is not a string (%s); kvnet leaves it instead of %q", net.Name, e.Raw(multus.KeyIPAMClaimReference), claim)
		return "", nil
	case cur == claim:
		return claim, nil
	case cur != "":
		req.Warn("network %s already references IPAMClaim %q; kvnet leaves it instead of %q", net.Name, cur, claim)
		return "", nil
	}
	if e.Has(multus.KeyIPs) {
		req.Warn("network %s asks for fixed \"ips\"; kvnet does not add ipam-claim-reference %q (Multus refuses both on one element)", net.Name, claim)
		return "", nil
	}
	var c ipamv1alpha1.IPAMClaim
	switch err := m.Cache.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: claim}, &c); {
	case apierrors.IsNotFound(err):
		// Not created yet (or not cached yet): the controller will create it.
	case err != nil:
		return "", fmt.Errorf("reading IPAMClaim %s/%s: %w", req.Namespace, claim, err)
	case !owner.Owns(&c):
		req.Warn("IPAMClaim %s is controlled by another object; network %s gets no persistent IP", claim, net.Name)
		return "", nil
	}
	return claim, nil
}

// vmi reads the VMI from the cache, or from the API server when the cache
// has not seen it yet (or uncached is set: the cached copy is older than the
// pod). cached reports where it came from. A VMI that does not exist means
// the pod is not a launcher kvnet can help; it is left alone.
func (m VMIReader) vmi(ctx context.Context, namespace, name string, uncached bool) (vmi *kubevirtv1.VirtualMachineInstance, cached bool, err error) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	vmi = &kubevirtv1.VirtualMachineInstance{}
	if !uncached {
		err = m.Cache.Get(ctx, key, vmi)
		cached = err == nil
	}
	if (uncached || apierrors.IsNotFound(err)) && m.API != nil {
		logf.FromContext(ctx).V(1).Info("reading the VMI from the API server: the cache does not have it or has an older copy", "vmi", name)
		err = m.API.Get(ctx, key, vmi)
	}
	switch {
	case apierrors.IsNotFound(err):
		logf.FromContext(ctx).V(1).Info("launcher pod's VMI does not exist; no IPAMClaim references", "vmi", name)
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading VirtualMachineInstance %s/%s: %w", namespace, name, err)
	}
	return vmi, cached, nil
}

// unknownInterface reports whether an element names a pod interface that no
// network of the VMI maps to.
func unknownInterface(elems []*multus.Element, byIface, byOrdinal map[string]*kubevirtv1.Network) bool {
	for _, e := range elems {
		if iface := e.Interface(); iface != "" && byIface[iface] == nil && byOrdinal[iface] == nil {
			return true
		}
	}
	return false
}

// interfaceIndex maps the pod interface names KubeVirt may have used for
// each secondary Multus network to that network: the hashed name of current
// KubeVirt, and the ordinal "net1", "net2", ... of older pods.
func interfaceIndex(nets []kubevirtv1.Network) (byIface, byOrdinal map[string]*kubevirtv1.Network) {
	byIface, byOrdinal = map[string]*kubevirtv1.Network{}, map[string]*kubevirtv1.Network{}
	n := 0
	for i := range nets {
		net := &nets[i]
		if net.Multus == nil || net.Multus.Default {
			continue
		}
		n++
		byIface[persistentips.PodInterfaceName(net.Name)] = net
		byOrdinal[fmt.Sprintf("net%d", n)] = net
	}
	return byIface, byOrdinal
}

// matchNetwork finds the VMI network a selection element attaches: by its
// interface name, else (no interface) by the NAD it names when exactly one
// network attaches that NAD.
func matchNetwork(podNamespace string, e *multus.Element, nets []kubevirtv1.Network, byIface, byOrdinal map[string]*kubevirtv1.Network) *kubevirtv1.Network {
	if iface := e.Interface(); iface != "" {
		if n := byIface[iface]; n != nil {
			return n
		}
		return byOrdinal[iface]
	}
	var found *kubevirtv1.Network
	for i := range nets {
		n := &nets[i]
		if n.Multus == nil || n.Multus.Default {
			continue
		}
		ref, err := netattach.ParseRefIn(n.Multus.NetworkName, podNamespace)
		if err != nil || !e.Refers(podNamespace, ref.Namespace, ref.Name) {
			continue
		}
		if found != nil {
			return nil // ambiguous: two networks on one NAD, and no interface to tell them apart
		}
		found = n
	}
	return found
}

// leaveClaimRefs notes that mutator left the IPAMClaim references of
// networks to ipam-extensions, registered as webhook: in the pod's
// kvnet.io/mutations and, the first time kvnet sees the pod, in
// kvnet_launcher_claim_refs_left_to_peer_total and one log line. The API
// server reinvokes kvnet after the peer changed the pod, and by then the
// pod carries the record, so a pod is counted once.
func leaveClaimRefs(ctx context.Context, req *chain.PodRequest, mutator, webhook string, networks []string) {
	if !req.LeftBefore(mutator, peers.IPAMExtensions) {
		claimRefsLeft.WithLabelValues(peers.IPAMExtensions).Add(float64(len(networks)))
		logf.FromContext(ctx).Info("leaving the pod's IPAMClaim references to ipam-extensions, which is registered for it",
			"namespace", req.Namespace, "pod", podName(req.Pod), "webhook", webhook, "mutator", mutator, "networks", networks)
	}
	req.RecordLeftTo(mutator, peers.IPAMExtensions, networks...)
}
