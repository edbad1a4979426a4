package persistentips

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/go-logr/logr"
	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// MACAnnotation on a claim is the MAC of the interface whose IPs the claim
// holds, as the source cluster's VMI reported it. It lives on
// the claim, not on the VMI or the VMIM, because the claim is the one
// object per network that the receiver writes and the launcher-pod webhook
// already reads (mutators.ClaimRefs): the webhook sets it as the Multus
// element's "mac", so the pod's port carries the guest's MAC, which the
// libvirt domain brings along unchanged. The VMI has no status subresource
// and its annotations are the tenant's to edit; the claim is written by
// kvnet alone.
const MACAnnotation = lookup.ClaimMACAnnotation

// RefusedAnnotation on a receive VMIM says why kvnet refused the last
// network identity a peer sent for it, as "<reason>: <what>" (at most
// maxRefusedNote bytes); it goes once an identity is taken. The target
// pod's denial repeats it (mutators.ReceivedIdentity), so that whoever
// watches the pod wait sees why without reading events. It names nothing
// of another namespace (the refusals do not). The VMIM's users may edit
// it; that changes only what their own pod's denial says.
const RefusedAnnotation = "kvnet.io/network-identity-refused"

const maxRefusedNote = 512

// Reasons a received identity is refused, the values of the received
// counter's outcome label beside OutcomeAccepted.
const (
	OutcomeAccepted      = "accepted"
	ReasonLate           = "target-pod-exists"
	ReasonNetworkName    = "network-name"
	ReasonOutsideSubnets = "outside-subnets"
	ReasonHeld           = "ip-held"
	ReasonClaim          = "claim-conflict"
)

// ReceivedNetwork is one network of a migration's network identity, as
// the proxy's hop carried it (proxy.NetworkIdentity: the layout keeps this
// package from importing the proxy, so cmd/kvnet/app converts).
type ReceivedNetwork struct {
	// Name is the VM's network (spec.networks[].name), which names the claim.
	Name string
	// NetworkName is the network the source's NAD attaches to.
	NetworkName string
	MAC         net.HardwareAddr
	IPs         []netip.Prefix
}

// Mismatch is an identity this cluster cannot honour; Reason is one of
// the Reason constants, Err says which field and why.
type Mismatch struct {
	Reason string
	Err    error
	// Holder, for ip-held, names the claim or pod that holds the address,
	// for the log only: Err names it only in the receiving namespace.
	Holder string
}

func (e *Mismatch) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *Mismatch) Unwrap() error { return e.Err }

func mismatch(reason, format string, a ...any) error {
	return &Mismatch{Reason: reason, Err: fmt.Errorf(format, a...)}
}

// Receiver takes a migration's network identity for the receiving VM of
// this cluster: it checks it against this cluster, then writes the
// receiving VM's claims (kvnet's names, owner and finalizer, as the
// controller would create them) with the source's IPs in their status and
// the MAC in MACAnnotation. OVN-Kubernetes then gives the target pod
// exactly those IPs (pkg/allocator/pod allocatePodAnnotationWithRollback
// takes a populated claim's status.ips as they are) without checking
// whether another pod holds them, which is why the checks here come first.
type Receiver struct {
	// Client writes claims, their status and events.
	Client client.Client
	// Reader reads uncached: a stale cache could hide the pod or claim
	// that already holds an address.
	Reader client.Reader
	// Facts resolves NADs.
	Facts lookup.Facts
	// Events records the outcome on the receive VMIM; nil records nothing.
	Events events.EventRecorder
	Log    logr.Logger
}

// Receive checks and stores the identity nets for the receive VMIM vmimKey,
// which the proxy has already tied to peer and to the migration ID. A
// refusal is a *Mismatch; any other error is a failed read or write.
func (r *Receiver) Receive(ctx context.Context, peer string, vmimKey types.NamespacedName, nets []ReceivedNetwork) error {
	log := r.Log.WithValues("peer", peer, "vmim", vmimKey.String())
	var vmim kubevirtv1.VirtualMachineInstanceMigration
	if err := r.Reader.Get(ctx, vmimKey, &vmim); err != nil {
		return fmt.Errorf("reading VirtualMachineInstanceMigration %s: %w", vmimKey, err)
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: vmim.Namespace, Name: vmim.Spec.VMIName}, &vmi); err != nil {
		return fmt.Errorf("reading the receiving VirtualMachineInstance %s/%s: %w", vmim.Namespace, vmim.Spec.VMIName, err)
	}
	owner := OwnerOf(&vmi)
	err := r.late(ctx, &vmim)
	var plans []plannedClaim
	if err == nil {
		plans, err = r.plan(ctx, owner, &vmi, nets)
	}
	if err == nil {
		err = r.held(ctx, owner, plans)
	}
	for i := 0; err == nil && i < len(plans); i++ {
		err = r.write(ctx, owner, plans[i])
	}
	var m *Mismatch
	switch {
	case errors.As(err, &m):
		identitiesReceived.WithLabelValues(m.Reason).Inc()
		if m.Holder != "" {
			log = log.WithValues("holder", m.Holder)
		}
		log.Info("refused a migration's network identity", "reason", m.Reason, "error", m.Err.Error())
		r.event(&vmim, corev1.EventTypeWarning, "NetworkIdentityRefused", m.Reason,
			"kvnet refused the network identity peer %s sent for this migration (%s): %v; the target pod is not admitted", peer, m.Reason, m.Err)
		if nerr := r.note(ctx, &vmim, m.Reason+": "+m.Err.Error()); nerr != nil {
			log.Error(nerr, "recording the refusal on the receive VMIM")
		}
		return err
	case err != nil:
		return err
	}
	if err := r.note(ctx, &vmim, ""); err != nil {
		log.Error(err, "removing an earlier refusal from the receive VMIM")
	}
	identitiesReceived.WithLabelValues(OutcomeAccepted).Inc()
	log.Info("stored a migration's network identity in the receiving VM's claims", "vmi", vmi.Name, "claims", len(plans))
	r.event(&vmim, corev1.EventTypeNormal, "NetworkIdentityReceived", OutcomeAccepted,
		"kvnet wrote the IPs and MACs of %d networks that peer %s sent into the receiving VM's IPAMClaims", len(plans), peer)
	return nil
}

// late refuses an identity that arrives after the target pod exists:
// the pod has been admitted (or its IPs allocated) without it, and
// writing claims now would not reach it.
func (r *Receiver) late(ctx context.Context, vmim *kubevirtv1.VirtualMachineInstanceMigration) error {
	var pods corev1.PodList
	if err := r.Reader.List(ctx, &pods, client.InNamespace(vmim.Namespace), client.MatchingLabels{kubevirtv1.MigrationJobLabel: string(vmim.UID)}); err != nil {
		return fmt.Errorf("listing the target pods of VirtualMachineInstanceMigration %s/%s: %w", vmim.Namespace, vmim.Name, err)
	}
	if len(pods.Items) > 0 {
		return mismatch(ReasonLate, "target pod %s of this migration already exists", pods.Items[0].Name)
	}
	return nil
}

// plannedClaim is one claim to write: the VM network's claim as kvnet
// names it, and what the source sent for it.
type plannedClaim struct {
	claim *ipamv1alpha1.IPAMClaim
	sent  ReceivedNetwork
	nad   *netattach.Info
}

// plan matches the identity to the receiving VMI's networks: each network
// sent must be a secondary Multus network of the VMI whose NAD allows
// persistent IPs, attaches the same network (its CNI config's "name") and
// has a subnet holding each IP; each such network of the VMI must have been
// sent, or its target pod would wait for IPs that never come.
func (r *Receiver) plan(ctx context.Context, owner Owner, vmi *kubevirtv1.VirtualMachineInstance, nets []ReceivedNetwork) ([]plannedClaim, error) {
	sent := map[string]ReceivedNetwork{}
	for _, n := range nets {
		sent[n.Name] = n
	}
	var out []plannedClaim
	for _, vn := range vmi.Spec.Networks {
		info, err := r.claimableNAD(ctx, vmi.Namespace, vn)
		if err != nil {
			return nil, err
		}
		if info == nil {
			continue
		}
		n, ok := sent[vn.Name]
		if !ok {
			return nil, mismatch(ReasonNetworkName, "networks: the receiving VM's network %q (NetworkAttachmentDefinition %s) keeps persistent IPs but the identity has none for it", vn.Name, info.Ref())
		}
		delete(sent, vn.Name)
		if n.NetworkName != info.NetworkName {
			return nil, mismatch(ReasonNetworkName, "networks[%s].networkName: %q, but NetworkAttachmentDefinition %s here attaches network %q", n.Name, n.NetworkName, info.Ref(), info.NetworkName)
		}
		for _, ip := range n.IPs {
			if !slices.ContainsFunc(info.Subnets, func(s netip.Prefix) bool { return s.Contains(ip.Addr()) }) {
				return nil, mismatch(ReasonOutsideSubnets, "networks[%s].ips: %v is in no subnet of NetworkAttachmentDefinition %s (%v)", n.Name, ip, info.Ref(), info.Subnets)
			}
		}
		out = append(out, plannedClaim{claim: NewClaim(owner, vn.Name, info.NetworkName), sent: n, nad: info})
	}
	for name := range sent {
		return nil, mismatch(ReasonNetworkName, "networks[%s].name: the receiving VM has no secondary network %q whose NetworkAttachmentDefinition allows persistent IPs", name, name)
	}
	return out, nil
}

// claimableNAD is the NAD of a secondary Multus network that keeps
// persistent IPs, nil for any other network.
func (r *Receiver) claimableNAD(ctx context.Context, namespace string, vn kubevirtv1.Network) (*netattach.Info, error) {
	if vn.Multus == nil || vn.Multus.Default {
		return nil, nil
	}
	ref, err := netattach.ParseRefIn(vn.Multus.NetworkName, namespace)
	if err != nil {
		return nil, nil
	}
	info, err := r.Facts.NAD(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("reading NetworkAttachmentDefinition %s: %w", ref, err)
	}
	if ok, _ := Claimable(info); !ok {
		return nil, nil
	}
	return info, nil
}

// event records the outcome on the receive VMIM. The action is the
// outcome: the events API folds events of one reason and action into a
// series that keeps the first note, and each kind of refusal must say why.
func (r *Receiver) event(vmim *kubevirtv1.VirtualMachineInstanceMigration, typ, reason, outcome, note string, args ...any) {
	if r.Events != nil {
		r.Events.Eventf(vmim, nil, typ, reason, outcome, note, args...)
	}
}

// note sets RefusedAnnotation on vmim to value, or removes it for "".
func (r *Receiver) note(ctx context.Context, vmim *kubevirtv1.VirtualMachineInstanceMigration, value string) error {
	if len(value) > maxRefusedNote {
		value = value[:maxRefusedNote]
	}
	cur, has := vmim.Annotations[RefusedAnnotation]
	if cur == value && (has || value == "") {
		return nil
	}
	base := vmim.DeepCopy()
	if value == "" {
		delete(vmim.Annotations, RefusedAnnotation)
	} else {
		if vmim.Annotations == nil {
			vmim.Annotations = map[string]string{}
		}
		vmim.Annotations[RefusedAnnotation] = value
	}
	if err := r.Client.Patch(ctx, vmim, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("annotating VirtualMachineInstanceMigration %s/%s: %w", vmim.Namespace, vmim.Name, err)
	}
	return nil
}
