package mutators

import (
	"context"
	"fmt"
	"net"
	"strings"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
)

var targetPodsWaiting = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "kvnet_launcher_target_pods_waiting_for_identity_total",
	Help: "Target pods of a cross-cluster migration's receiving VM that kvnet denied because a claim of theirs had no IPs yet (the network identity from the source cluster had not arrived, or was refused); virt-controller creates the pod again.",
})

// ReceivedIdentity gives the target pod of a cross-cluster migration the
// source's network identity. The pod is one virt-controller's
// createTargetPod makes for a receive VMIM (spec.receive): its
// kubevirt.io/migrationJobUID label and kubevirt.io/migrationJobName
// annotation name the VMIM. For each Multus element that references a
// claim of the VM (ClaimRefs, earlier in the chain):
//
//   - while the claim has no IPs, the pod is denied (403) with the reason:
//     created now, OVN-Kubernetes would allocate a fresh IP into the claim
//     and the guest, which keeps its configured addresses, would lose its
//     connections. virt-controller creates the pod again on its next sync,
//     so a late identity costs a retry, and a lost one never becomes a new
//     address.
//   - once it has them, the element gets the source's MAC (the claim's
//     kvnet.io/mac, persistentips.MACAnnotation) as "mac": without it
//     OVN-Kubernetes derives the port's MAC from the IP, port security
//     then drops the guest's frames, whose MAC came along in the libvirt
//     domain.
//
// Only CREATE is acted on; an existing pod was admitted already.
type ReceivedIdentity VMIReader

// Name implements chain.PodMutator.
func (ReceivedIdentity) Name() string { return "received-identity" }

// MutatePod implements chain.PodMutator.
func (m ReceivedIdentity) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	pod := req.Pod
	if req.Operation != admissionv1.Create || !req.Config.PersistentIPsEnabled() || pod.Annotations[chain.SkipAnnotation] == "true" {
		return nil
	}
	uid, vmimName := pod.Labels[kubevirtv1.MigrationJobLabel], pod.Annotations[kubevirtv1.MigrationJobNameAnnotation]
	vmiName, raw := pod.Annotations[kubevirtv1.DomainAnnotation], pod.Annotations[multus.NetworksAnnotation]
	if uid == "" || vmimName == "" || vmiName == "" || raw == "" {
		return nil
	}
	vmim, err := m.receiving(ctx, req.Namespace, vmimName, uid)
	if vmim == nil || err != nil {
		return err
	}
	elems, err := multus.Parse(raw)
	if err != nil {
		return nil // ClaimRefs warned; Multus refuses the pod
	}
	vmi, _, err := VMIReader(m).vmi(ctx, req.Namespace, vmiName, false)
	if err != nil || vmi == nil {
		return err
	}
	owner := persistentips.OwnerOf(vmi)
	byIface, byOrdinal := interfaceIndex(vmi.Spec.Networks)
	// Beside ipam-extensions, kvnet left the references to it (ClaimRefs),
	// which may run after kvnet: an element without one still waits for
	// the claim it will reference.
	peer, err := req.Facts.IPAMExtensions(ctx)
	if err != nil {
		return err
	}
	var waiting []string
	changed := false
	for _, e := range elems {
		net := matchNetwork(req.Namespace, e, vmi.Spec.Networks, byIface, byOrdinal)
		if net == nil {
			continue
		}
		claim := persistentips.ClaimName(owner.Name, net.Name)
		switch ref := e.String(multus.KeyIPAMClaimReference); {
		case ref == claim:
		case ref == "" && peer != "":
			if want, err := ClaimRefs(m).claimFor(ctx, req, owner, e, net); err != nil || want != claim {
				if err != nil {
					return err
				}
				continue
			}
		default:
			continue
		}
		ok, set, err := m.identity(ctx, req, e, claim, net.Name)
		if err != nil {
			return err
		}
		if !ok {
			waiting = append(waiting, fmt.Sprintf("%s (IPAMClaim %s)", net.Name, claim))
		}
		changed = changed || set
	}
	if len(waiting) > 0 {
		targetPodsWaiting.Inc()
		logf.FromContext(ctx).Info("denied a migration target pod until its claims hold the source's IPs", "vmim", vmimName, "vmi", vmiName, "networks", waiting)
		why := ""
		if note := vmim.Annotations[persistentips.RefusedAnnotation]; note != "" {
			why = "; the source cluster's network identity was refused: " + note
		}
		return chain.RefuseForbidden(fmt.Sprintf("target pod of migration %s: the claims of networks %s hold no IPs yet; kvnet admits the pod once the source cluster's network identity is in them (see the events of VirtualMachineInstanceMigration %s)%s",
			vmimName, strings.Join(waiting, ", "), vmimName, why))
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

// receiving returns the VMIM the pod names when it is a receive VMIM and
// the one of the label's UID (a VMIM of the same name created again is
// another migration), else nil. It reads uncached when it can: target
// pods are few, and the VMIM was created just before the pod.
func (m ReceivedIdentity) receiving(ctx context.Context, namespace, name, uid string) (*kubevirtv1.VirtualMachineInstanceMigration, error) {
	r := m.API
	if r == nil {
		r = m.Cache
	}
	var vmim kubevirtv1.VirtualMachineInstanceMigration
	switch err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &vmim); {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading VirtualMachineInstanceMigration %s/%s: %w", namespace, name, err)
	}
	if string(vmim.UID) != uid || vmim.Spec.Receive == nil {
		return nil, nil
	}
	return &vmim, nil
}

// identity reports whether the element's claim holds IPs and, when it
// does, sets the claim's MAC on the element (set reports a change). The
// claim is read from the cache, and again from the API server when the
// cache has it without IPs: the receiver writes them just before
// virt-controller creates the pod.
func (m ReceivedIdentity) identity(ctx context.Context, req *chain.PodRequest, e *multus.Element, claim, network string) (ok, set bool, err error) {
	key := client.ObjectKey{Namespace: req.Namespace, Name: claim}
	var c ipamv1alpha1.IPAMClaim
	err = m.Cache.Get(ctx, key, &c)
	if (apierrors.IsNotFound(err) || err == nil && len(c.Status.IPs) == 0) && m.API != nil {
		err = m.API.Get(ctx, key, &c)
	}
	switch {
	case apierrors.IsNotFound(err):
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("reading IPAMClaim %s: %w", key, err)
	case len(c.Status.IPs) == 0:
		return false, false, nil
	}
	mac := c.Annotations[persistentips.MACAnnotation]
	if _, perr := net.ParseMAC(mac); mac == "" || perr != nil {
		if mac != "" {
			req.Warn("IPAMClaim %s has %s %q, not a MAC; network %s keeps the MAC KubeVirt chose", key.Name, persistentips.MACAnnotation, mac, network)
		}
		return true, false, nil
	}
	cur := e.String(multus.KeyMAC)
	if strings.EqualFold(cur, mac) {
		return true, false, nil
	}
	if cur != "" {
		req.Warn("network %s: the source cluster's MAC %s replaces %q, as the guest keeps the source's MAC", network, mac, cur)
	}
	e.SetString(multus.KeyMAC, mac)
	return true, true, nil
}
