package mutators

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/metrics"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/peers"
)

// ComputeContainer is the virt-launcher pod's container that runs the VM,
// where KubeVirt asks for the VM's devices.
const ComputeContainer = "compute"

var resourcesAdded = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "kvnet_launcher_resources_added_total",
	Help: "Device-plugin resources kvnet added to virt-launcher pods' compute containers for their Multus networks (one per resource name and pod; a resource already set is not counted).",
})

var resourcesLeft = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_launcher_resources_left_to_peer_total",
	Help: "Device-plugin resources of virt-launcher pods' Multus networks that kvnet left to a peer webhook registered for the pod (one per resource name and pod), by peer.",
}, []string{"peer"})

var claimRefsLeft = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_launcher_claim_refs_left_to_peer_total",
	Help: "IPAMClaim references of virt-launcher pods' Multus networks that kvnet left to a peer webhook registered in the cluster (one per network and pod), by peer.",
}, []string{"peer"})

// RegisterMetrics registers the mutators' metrics on reg. The series of
// each known peer exists from start-up at 0, so that the first pod left to
// it is an increase.
func RegisterMetrics(reg prometheus.Registerer) error {
	resourcesLeft.WithLabelValues(peers.ResourceInjector)
	claimRefsLeft.WithLabelValues(peers.IPAMExtensions)
	macsMissed.WithLabelValues(peers.Kubemacpool)
	macsLeft.WithLabelValues(peers.Kubemacpool)
	macsAsked.WithLabelValues(peers.Kubemacpool, "macs")
	return metrics.Register(reg, resourcesAdded, resourcesLeft, claimRefsLeft, macsMissed, macsLeft, macsAsked, targetPodsWaiting)
}

// NetworkResources gives a virt-launcher pod the device-plugin resources of
// its Multus networks: for each attachment (an element of
// k8s.v1.cni.cncf.io/networks, or the v1.multus-cni.io/default-network
// element) whose NAD has a k8s.v1.cni.cncf.io/resourceName, one unit of that
// resource in the compute container's requests and limits, summed per
// resource. Without it the SR-IOV or vDPA device plugin allocates nothing,
// and the CNI fails the pod for lack of a device.
//
// KubeVirt used to do this itself; since v1.8 its ExternalNetResourceInjection
// feature gate (Beta, so on by default in v1.9) stops virt-controller from
// reading NADs and leaves the resources to a webhook, as
// network-resources-injector is. kvnet already caches every NAD, so it needs
// no API call here.
//
// It steps aside per resource: a resource that any container already
// requests or limits is left as it is. That is the case when KubeVirt writes
// it (the gate switched off in the KubeVirt CR, or a KubeVirt before v1.8),
// when network-resources-injector ran first, and when kvnet itself ran
// before (the API server's reinvocation): no resource is ever counted twice.
//
// It steps aside for a whole pod when network-resources-injector is
// registered for it (lookup.Facts.ResourceInjector, from the cluster's
// MutatingWebhookConfigurations): that injector, with -honor-resources,
// adds its count to what containers[0] already asks for, so a pod that
// kvnet completed first would ask for two devices per attachment, and
// kvnet cannot see the flag. Left to it, each resource is counted once in
// either webhook order and either mode (docs/peers.md). kvnet says so in
// the pod's kvnet.io/mutations (a change with leftTo), in
// kvnet_launcher_resources_left_to_peer_total and in a log line. Only the
// resources: the node selector below is kvnet's still, as the two write
// the same label and kvnet refuses a conflict the injector would overwrite.
//
// The NAD's k8s.v1.cni.cncf.io/nodeSelector annotation, one "key=value"
// node label, is added to the pod's nodeSelector as network-resources-
// injector adds it (for any attachment, with or without a resource). Where
// the pod, or another of its NADs, already selects the same key with
// another value the pod is refused (403) naming both: network-resources-
// injector overwrites the value, which would move the VM off the nodes its
// owner chose, and keeping the pod's value would schedule it where the
// network is not. A malformed annotation refuses the pod too, naming the
// NAD, as network-resources-injector does.
//
// Only on CREATE: a pod's resources and node selector cannot change later,
// and a NIC hotplugged into a running VM gets its device through the
// migration KubeVirt starts, whose target pod is created.
type NetworkResources struct{}

// Name implements chain.PodMutator.
func (NetworkResources) Name() string { return "network-resources" }

// attachment is one Multus attachment of the pod and its NAD.
type attachment struct {
	ref  string // "namespace/name" of the NAD
	info *netattach.Info
}

// MutatePod implements chain.PodMutator.
func (m NetworkResources) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	pod := req.Pod
	if req.Operation != admissionv1.Create || !req.Config.InjectResources() || pod.Annotations[chain.SkipAnnotation] == "true" {
		return nil
	}
	atts, err := m.attachments(ctx, req)
	if err != nil || len(atts) == 0 {
		return err
	}
	// Node selector first: a refusal must not leave half a change behind.
	sel, err := nodeSelectorOf(pod, atts)
	if err != nil {
		return err
	}
	res := resourcesOf(atts)
	if len(res.order) > 0 {
		left, err := m.leaveToInjector(ctx, req, res)
		if err != nil {
			return err
		}
		if left {
			res.order = nil
		}
	}
	m.addResources(ctx, req, res)
	for k, v := range sel.want {
		if _, ok := pod.Spec.NodeSelector[k]; ok {
			continue // the same value: checked in nodeSelectorOf
		}
		if pod.Spec.NodeSelector == nil {
			pod.Spec.NodeSelector = map[string]string{}
		}
		pod.Spec.NodeSelector[k] = v
		req.Record(m.Name(), sel.networks...)
	}
	return nil
}

// podNodeSelector is the node labels a pod's networks need, and the
// networks that ask for them.
type podNodeSelector struct {
	want     map[string]string
	networks []string
}

// nodeSelectorOf is the node labels atts need (their NADs' node-selector
// annotations). Two values of one label, or a value the pod's own
// nodeSelector contradicts, refuse the pod: no node would have both.
func nodeSelectorOf(pod *corev1.Pod, atts []attachment) (podNodeSelector, error) {
	sel := podNodeSelector{want: map[string]string{}}
	from := map[string]string{}
	for _, a := range atts {
		if a.info.NodeSelectorError != nil {
			return sel, chain.RefuseForbidden(fmt.Sprintf("NetworkAttachmentDefinition %s: %v; fix the annotation, or remove it", a.ref, a.info.NodeSelectorError))
		}
		l := a.info.NodeSelector
		if l == nil {
			continue
		}
		if v, ok := sel.want[l.Key]; ok && v != l.Value {
			return sel, chain.RefuseForbidden(fmt.Sprintf("the pod's networks ask for two values of node label %q: %q (NetworkAttachmentDefinition %s) and %q (%s), through their %s annotations; no node has both", l.Key, v, from[l.Key], l.Value, a.ref, netattach.NodeSelectorAnnotation))
		}
		sel.want[l.Key], from[l.Key] = l.Value, a.ref
		if v, ok := pod.Spec.NodeSelector[l.Key]; ok && v != l.Value {
			return sel, chain.RefuseForbidden(fmt.Sprintf("the pod selects nodes with %s=%q, but NetworkAttachmentDefinition %s exists only on nodes with %s=%q (its %s annotation); change the VM's nodeSelector or the network", l.Key, v, a.ref, l.Key, l.Value, netattach.NodeSelectorAnnotation))
		}
		sel.networks = appendOnce(sel.networks, a.ref)
	}
	return sel, nil
}

// podResources counts the device-plugin resources a pod's networks take,
// in the order they first appear, and the networks of each.
type podResources struct {
	counts map[corev1.ResourceName]int64
	order  []corev1.ResourceName
	nets   map[corev1.ResourceName][]string
}

func resourcesOf(atts []attachment) podResources {
	res := podResources{counts: map[corev1.ResourceName]int64{}, nets: map[corev1.ResourceName][]string{}}
	for _, a := range atts {
		if a.info.ResourceName == "" {
			continue
		}
		r := corev1.ResourceName(a.info.ResourceName)
		if res.counts[r] == 0 {
			res.order = append(res.order, r)
		}
		res.counts[r]++
		res.nets[r] = appendOnce(res.nets[r], a.ref)
	}
	return res
}

// leaveToInjector reports whether network-resources-injector is called for
// the pod, and then leaves the resources to it: recorded in
// kvnet.io/mutations and, once per pod (the API server reinvokes kvnet
// after the injector changed the pod, and the record is there by then),
// counted and logged.
func (m NetworkResources) leaveToInjector(ctx context.Context, req *chain.PodRequest, res podResources) (bool, error) {
	peer, err := req.Facts.ResourceInjector(ctx, req.Namespace, req.Pod.Labels)
	if err != nil || peer == "" {
		return false, err
	}
	var all []string
	for _, r := range res.order {
		all = append(all, res.nets[r]...)
	}
	if !req.LeftBefore(m.Name(), peers.ResourceInjector) {
		resourcesLeft.WithLabelValues(peers.ResourceInjector).Add(float64(len(res.order)))
		logf.FromContext(ctx).Info("leaving the pod's device resources to network-resources-injector, which the API server calls for it",
			"namespace", req.Namespace, "pod", podName(req.Pod), "webhook", peer, "resources", res.order)
	}
	req.RecordLeftTo(m.Name(), peers.ResourceInjector, all...)
	return true, nil
}

// addResources requests and limits res's resources on the compute
// container, each one not already set on some container.
func (m NetworkResources) addResources(ctx context.Context, req *chain.PodRequest, res podResources) {
	if len(res.order) == 0 {
		return
	}
	pod := req.Pod
	compute := -1
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == ComputeContainer {
			compute = i
		}
	}
	if compute < 0 {
		req.Warn("kvnet found no %q container in the pod, so it adds no device resources for its networks", ComputeContainer)
		return
	}
	log := logf.FromContext(ctx)
	var added []corev1.ResourceName
	for _, r := range res.order {
		if set := requestedBy(pod.Spec.Containers, r); set != "" {
			log.V(1).Info("device resource already set; not adding it", "resource", r, "container", set, "attachments", res.counts[r])
			continue
		}
		c := &pod.Spec.Containers[compute].Resources
		if c.Requests == nil {
			c.Requests = corev1.ResourceList{}
		}
		if c.Limits == nil {
			c.Limits = corev1.ResourceList{}
		}
		q := *resource.NewQuantity(res.counts[r], resource.DecimalSI)
		c.Requests[r], c.Limits[r] = q, q
		added = append(added, r)
		req.Record(m.Name(), res.nets[r]...)
	}
	if len(added) > 0 {
		resourcesAdded.Add(float64(len(added)))
		log.V(1).Info("added network device resources to the compute container", "resources", added)
	}
}

// attachments lists the pod's Multus attachments whose NAD kvnet knows, in
// annotation order, the default network's first. A NAD that is missing
// costs only its attachment (with a warning): Multus fails such a pod
// anyway, and with a message that names the NAD.
func (NetworkResources) attachments(ctx context.Context, req *chain.PodRequest) ([]attachment, error) {
	var refs []nadRef
	for _, a := range []struct {
		key   string
		parse func(string) ([]*multus.Element, error)
	}{{multus.DefaultNetworkAnnotation, multus.ParseDefaultNetwork}, {multus.NetworksAnnotation, multus.Parse}} {
		raw := req.Pod.Annotations[a.key]
		if raw == "" {
			continue
		}
		if fast, ok := nadRefsV2(raw); ok {
			refs = append(refs, fast...)
			continue
		}
		es, err := a.parse(raw)
		if err != nil {
			// The pod is KubeVirt's; a broken annotation is Multus' to refuse.
			req.Warn("kvnet cannot read %s, so it adds no device resources for it: %v", a.key, err)
			continue
		}
		for _, e := range es {
			refs = append(refs, nadRef{Name: e.Name(), Namespace: e.Namespace()})
		}
	}
	out := make([]attachment, 0, len(refs))
	for _, r := range refs {
		ref := netattach.Ref{Namespace: cmp.Or(r.Namespace, req.Namespace), Name: r.Name}
		info, err := req.Facts.NAD(ctx, ref)
		if err != nil {
			return nil, fmt.Errorf("reading NetworkAttachmentDefinition %s: %w", ref, err)
		}
		if info == nil {
			req.Warn("NetworkAttachmentDefinition %s does not exist; kvnet adds no device resource or node selector for it", ref)
			continue
		}
		out = append(out, attachment{ref: ref.String(), info: info})
	}
	return out, nil
}

// nadRef is the part of a selection element this mutator reads.
type nadRef struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
}

// nadRefsV2 reads the JSON list form, the one virt-controller writes, with
// encoding/json/v2 into names only: the full element parse (which keeps
// every key for the mutators that rewrite the annotation) was a third of
// the launcher-pod webhook's allocations here. Anything v2 refuses, or an
// element without a name, is left to multus.Parse, whose errors users see.
func nadRefsV2(raw string) ([]nadRef, bool) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, false
	}
	var refs []nadRef
	if jsonv2.Unmarshal([]byte(raw), &refs) != nil {
		return nil, false
	}
	for _, r := range refs {
		if r.Name == "" {
			return nil, false
		}
	}
	return refs, true
}

// requestedBy names the first container that requests or limits r, or "".
func requestedBy(cs []corev1.Container, r corev1.ResourceName) string {
	for i := range cs {
		_, req := cs[i].Resources.Requests[r]
		_, lim := cs[i].Resources.Limits[r]
		if req || lim {
			return cs[i].Name
		}
	}
	return ""
}

// podName is the pod's name, or its generateName before the API server
// has given it one (launcher pods are admitted so).
func podName(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	return pod.GenerateName
}

func appendOnce(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}
