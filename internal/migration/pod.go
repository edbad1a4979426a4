package migration

import (
	"encoding/json"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/model/multus"
)

// NodeOf is the node a pod will run on: spec.nodeName, or, for DaemonSet
// pods (which the scheduler places, so they have no nodeName at admission),
// the single metadata.name value of the required node affinity's matchFields
// that the DaemonSet controller writes. "" when the pod is not pinned.
func NodeOf(pod *corev1.Pod) string {
	if pod.Spec.NodeName != "" {
		return pod.Spec.NodeName
	}
	aff := pod.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	node := ""
	for _, term := range aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key != metav1.ObjectNameField || f.Operator != corev1.NodeSelectorOpIn || len(f.Values) != 1 {
				continue
			}
			if node != "" && node != f.Values[0] {
				return "" // terms are ORed: two nodes means not pinned
			}
			node = f.Values[0]
		}
	}
	return node
}

// Live reports whether a pod that exists may hold its addresses. A pod in a
// terminal phase has had its sandbox torn down; a pod being deleted (with a
// deletionTimestamp) is still live until it is gone, because its containers
// and network may run until the grace period ends.
func Live(pod *corev1.Pod) bool {
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// Holds reports whether the pod's Multus selection asks for address a.
func Holds(pod *corev1.Pod, a netip.Addr) bool {
	for _, addr := range PodAddresses(pod) {
		if addr == a {
			return true
		}
	}
	return false
}

// PodAddresses lists every static address in the pod's Multus selection.
func PodAddresses(pod *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, p := range PodPrefixes(pod) {
		out = append(out, p.Addr())
	}
	return out
}

// PodPrefixes lists every static address in the pod's Multus selection with
// its prefix length (a bare address counts as a host prefix).
func PodPrefixes(pod *corev1.Pod) []netip.Prefix {
	elems, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		return nil
	}
	var out []netip.Prefix
	for _, e := range elems {
		for _, s := range elementIPs(e) {
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p)
			} else if a, err := netip.ParseAddr(s); err == nil {
				out = append(out, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	return out
}

func elementIPs(e *multus.Element) []string {
	var ips []string
	if raw := e.Raw(multus.KeyIPs); raw != nil {
		_ = json.Unmarshal(raw, &ips)
	}
	return ips
}

// ownerRef is the pod's controller (DaemonSet or ReplicaSet): the object
// events about a pod that does not exist yet go to.
func ownerRef(pod *corev1.Pod, namespace string) *corev1.ObjectReference {
	for _, o := range pod.OwnerReferences {
		if o.Controller != nil && *o.Controller {
			return &corev1.ObjectReference{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID, Namespace: namespace}
		}
	}
	return nil
}
