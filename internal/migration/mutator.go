package migration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/record"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// MutatorName names the pod mutator in metrics and errors.
const MutatorName = "migration-addresses"

// Network is one migration network a pod gets, resolved from config.
type Network struct {
	Pool      PoolSpec
	NAD       netattach.Ref
	Interface string
	// NADField is the config path of the NAD, for messages.
	NADField string
}

// Pod is what decides which migration networks a pod gets: the labels it
// claims a role by, and the namespace and ServiceAccount that say who
// created it.
type Pod struct {
	Namespace      string
	ServiceAccount string
	Labels         map[string]string
}

// PodOf is the identity of a pod under admission in namespace ns (the
// request's: a pod being created may not carry it yet).
func PodOf(pod *corev1.Pod, ns string) Pod {
	return Pod{Namespace: ns, ServiceAccount: pod.Spec.ServiceAccountName, Labels: pod.Labels}
}

// Networks returns the migration networks a pod gets: a cross-cluster
// holder gets the cross-cluster network (and the in-cluster one with
// alsoInCluster or when it gets the proxy sidecar), a virt-handler the
// in-cluster network. A pod's labels only say what it claims to be: it
// gets a network only when its namespace and ServiceAccount are a holder's
// as well (kubevirtNS is KubeVirt's namespace). A pod that claims a role
// it does not hold gets nothing, and notHolder names the check it failed.
func Networks(m *config.Migration, pod Pod, kubevirtNS string) (nets []Network, notHolder string) {
	addIC := false
	if cc := m.CrossCluster; cc != nil && cc.Selects(pod.Labels) {
		if ok, why := cc.Admits(pod.Namespace, pod.ServiceAccount, kubevirtNS); !ok {
			return nil, why
		}
		nets = append(nets, crossClusterNetwork(m))
		// A pod with the proxy sidecar needs migration0 too: its relays
		// listen there for the source virt-handlers.
		addIC = cc.AlsoInCluster || m.Sidecar(pod.Labels) != nil
	} else if ic := m.InCluster; ic != nil && ic.Selects(pod.Labels) {
		if ok, why := ic.Admits(pod.Namespace, pod.ServiceAccount, kubevirtNS); !ok {
			return nil, why
		}
		addIC = true
	}
	if addIC && m.InCluster != nil {
		nets = append([]Network{inClusterNetwork(m)}, nets...)
	}
	return nets, ""
}

// claimsRole reports whether the pod's labels select it for any migration
// network: only then is KubeVirt's namespace worth looking up.
func claimsRole(m *config.Migration, labels map[string]string) bool {
	return (m.CrossCluster != nil && m.CrossCluster.Selects(labels)) || (m.InCluster != nil && m.InCluster.Selects(labels))
}

// KubeVirtNamespace is KubeVirt's namespace: migration.namespace, else the
// namespace of the KubeVirt CR (from the informer cache), else "" (then no
// pod holds addresses through a holder of KubeVirt's namespace).
func KubeVirtNamespace(ctx context.Context, m *config.Migration, facts interface {
	KubeVirt(context.Context) (*kubevirtv1.KubeVirt, error)
}) (string, error) {
	if m.Namespace != "" {
		return m.Namespace, nil
	}
	kv, err := facts.KubeVirt(ctx)
	if err != nil || kv == nil {
		return "", err
	}
	return kv.Namespace, nil
}

// holderNetworks is Networks for a pod under admission: it resolves
// KubeVirt's namespace only for pods that claim a role and, with report,
// counts and logs a look-alike it leaves untouched (the address step
// reports; the sidecar step, which runs on the same pod, does not).
func holderNetworks(ctx context.Context, req *chain.PodRequest, report bool) ([]Network, error) {
	m := &req.Config.Migration
	if !claimsRole(m, req.Pod.Labels) {
		return nil, nil
	}
	kvNS, err := KubeVirtNamespace(ctx, m, req.Facts)
	if err != nil {
		return nil, fmt.Errorf("finding KubeVirt's namespace: %w", err)
	}
	id := PodOf(req.Pod, req.Namespace)
	nets, notHolder := Networks(m, id, kvNS)
	if notHolder != "" && report {
		notHolders.WithLabelValues(notHolder).Inc()
		logf.FromContext(ctx).Info("left a pod with KubeVirt's migration labels untouched: it is not a migration address holder",
			"reason", notHolder, "namespace", id.Namespace, "serviceAccount", id.ServiceAccount, "kubevirtNamespace", kvNS,
			"role", req.Pod.Labels["kubevirt.io"])
	}
	return nets, nil
}

// inClusterNetwork is the in-cluster network as the loaded config gives it,
// its pool parsed when the config loaded.
func inClusterNetwork(m *config.Migration) Network {
	ic := m.InCluster
	return Network{
		Pool: PoolSpec{ID: PoolInCluster, Pool: ic.AddressPool(), Field: "migration.inCluster.pool", Timeout: m.Timeout()},
		NAD:  ic.NAD, Interface: ic.Interface, NADField: "migration.inCluster.nad",
	}
}

// crossClusterNetwork is inClusterNetwork's cross-cluster counterpart.
func crossClusterNetwork(m *config.Migration) Network {
	cc := m.CrossCluster
	return Network{
		Pool: PoolSpec{ID: PoolCrossCluster, Pool: cc.AddressPool(), Field: "migration.crossCluster.addresses", Timeout: m.Timeout()},
		NAD:  cc.NAD, Interface: cc.Interface, NADField: "migration.crossCluster.nad",
	}
}

// AddressMutator is the pod mutator of the migration-pods webhook (CREATE): it
// reserves an address per migration network and writes it into the pod's
// Multus selection, completing the element virt-operator put there
// ("<nad>@migration0") or adding one, and keeping every other element and key.
type AddressMutator struct {
	Alloc *Allocator
	// API reads the API server directly (idempotency checks).
	API client.Reader
	// Recorder gets denial events on the pod's controller; may be nil.
	Recorder record.EventRecorder
	// NewToken makes reservation tokens; default a random UUID.
	NewToken func() string
	// WaitSynced blocks until the allocation cache has synced; may be nil.
	WaitSynced func(context.Context) bool
}

// Name implements chain.PodMutator.
func (m *AddressMutator) Name() string { return MutatorName }

// MutatePod implements chain.PodMutator.
func (m *AddressMutator) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	if req.Operation != admissionv1.Create || req.Config == nil || !req.Config.Migration.Enabled() {
		return nil
	}
	pod := req.Pod
	nets, err := holderNetworks(ctx, req, true)
	if err != nil || len(nets) == 0 {
		return err
	}
	log := logf.FromContext(ctx)
	annPath := field.NewPath("metadata", "annotations").Key(multus.NetworksAnnotation)
	elems, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		denials.WithLabelValues(nets[0].Pool.ID, "bad-annotation").Inc()
		return chain.RefuseInvalid(schema.GroupKind{Kind: "Pod"}, podName(pod), field.ErrorList{field.Invalid(annPath, pod.Annotations[multus.NetworksAnnotation], err.Error())})
	}
	for _, n := range nets {
		info, err := req.Facts.NAD(ctx, n.NAD)
		if err != nil {
			return fmt.Errorf("reading NetworkAttachmentDefinition %s of %s: %w", n.NAD, n.NADField, err)
		}
		if info == nil {
			denials.WithLabelValues(n.Pool.ID, "nad-missing").Inc()
			return forbidden(fmt.Sprintf("%s: NetworkAttachmentDefinition %s does not exist; create it or fix kvnet's config", n.NADField, n.NAD))
		}
	}
	if m.WaitSynced != nil && !m.WaitSynced(ctx) {
		return errNotSynced
	}
	if token := pod.Labels[LabelReservation]; token != "" {
		kept, err := m.alreadyReserved(ctx, req.Namespace, nets, elems, token)
		if err != nil {
			return err
		}
		if kept {
			log.V(1).Info("pod already carries its reservation", "token", token)
			return nil
		}
	}
	if req.DryRun {
		return m.peek(ctx, req, nets, elems)
	}
	return m.reserve(ctx, req, nets, elems)
}

// peek answers a dry run: which addresses the pod would get, reserving
// none.
func (m *AddressMutator) peek(ctx context.Context, req *chain.PodRequest, nets []Network, elems []*multus.Element) error {
	token, node := m.token(), NodeOf(req.Pod)
	for _, n := range nets {
		a, ok, err := m.Alloc.Peek(ctx, AddressRequest{Pool: n.Pool, Token: token, Namespace: req.Namespace, Node: node})
		if err != nil {
			return fmt.Errorf("dry run: looking for a free address of %s: %w", n.Pool.Field, err)
		}
		if !ok {
			return forbidden(exhausted(n.Pool, nil).Message)
		}
		req.Warn("dry run: %s would get %s on %s, but nothing was reserved; a real create may get another address", n.Interface, n.Pool.Pool.CIDR(a), n.NAD)
		elems = setElement(req, elems, n, n.Pool.Pool.CIDR(a))
	}
	return writeAnnotation(req.Pod, elems, "")
}

// reserve reserves an address per network under one token and writes them
// into the pod's selection; the reservations made are rolled back when a
// later one, or the write, fails. An exhausted pool refuses the pod (403),
// with an event on its controller.
func (m *AddressMutator) reserve(ctx context.Context, req *chain.PodRequest, nets []Network, elems []*multus.Element) error {
	pod, log := req.Pod, logf.FromContext(ctx)
	token, node := m.token(), NodeOf(pod)
	var done []*Allocation
	rollback := func() {
		for _, a := range done {
			if err := m.Alloc.Rollback(ctx, a); err != nil {
				log.Error(err, "rolling back a reservation; it expires on its own", "address", a.Address)
			}
		}
	}
	for _, n := range nets {
		a, err := m.Alloc.Allocate(ctx, AddressRequest{Pool: n.Pool, Token: token, Namespace: req.Namespace, Node: node})
		if err != nil {
			rollback()
			var ex *ExhaustedError
			if errors.As(err, &ex) {
				denials.WithLabelValues(n.Pool.ID, "exhausted").Inc()
				log.Info("denied: migration pool exhausted", "pool", n.Pool.ID, "size", n.Pool.Pool.Size().String())
				if ref := ownerRef(pod, req.Namespace); ref != nil && m.Recorder != nil {
					m.Recorder.Event(ref, corev1.EventTypeWarning, "MigrationPoolExhausted", ex.Message)
				}
				// Not kvnet's failure: the pool is full, so a 403 as for
				// an exceeded quota.
				return forbidden(ex.Message)
			}
			return err
		}
		done = append(done, a)
		elems = setElement(req, elems, n, a.CIDR())
	}
	if err := writeAnnotation(pod, elems, token); err != nil {
		rollback()
		return err
	}
	allocated := make([]string, len(done))
	for i, a := range done {
		allocated[i] = a.Pool + "=" + a.Address.String()
	}
	log.Info("reserved migration addresses", "addresses", allocated, "node", node, "token", token)
	return nil
}

func (m *AddressMutator) token() string {
	if m.NewToken != nil {
		return m.NewToken()
	}
	return string(uuid.NewUUID())
}

// alreadyReserved handles a pod that arrives with a reservation token: a
// reinvoked webhook, or a second kvnet replica's webhook after the first.
// It keeps the addresses only if every one is reserved under that token and
// no existing pod carries the token, so a copied pod manifest cannot share
// another pod's address.
func (m *AddressMutator) alreadyReserved(ctx context.Context, namespace string, nets []Network, elems []*multus.Element, token string) (bool, error) {
	for _, n := range nets {
		e := findElement(elems, namespace, n)
		if e == nil {
			return false, nil
		}
		ips := elementIPs(e)
		if len(ips) != 1 {
			return false, nil
		}
		p, err := netip.ParsePrefix(ips[0])
		if err != nil {
			return false, nil
		}
		var cm corev1.ConfigMap
		err = m.API.Get(ctx, client.ObjectKey{Namespace: m.Alloc.Namespace, Name: ObjectName(n.Pool.ID, p.Addr())}, &cm)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("reading the allocation of %s: %w", p.Addr(), err)
		}
		a, err := FromConfigMap(&cm)
		if err != nil || a.State != StateReserved || a.Reservation != token || a.PodNamespace != namespace {
			return false, nil
		}
	}
	pods, err := podsWithToken(ctx, m.API, namespace, token)
	if err != nil {
		return false, err
	}
	return len(pods) == 0, nil
}

// findElement is the selection element for the network: same NAD, and the
// configured interface or none.
func findElement(elems []*multus.Element, podNamespace string, n Network) *multus.Element {
	for _, e := range elems {
		if e.Refers(podNamespace, n.NAD.Namespace, n.NAD.Name) && (e.Interface() == "" || e.Interface() == n.Interface) {
			return e
		}
	}
	return nil
}

// setElement completes the network's element with interface and ips, or
// appends one.
func setElement(req *chain.PodRequest, elems []*multus.Element, n Network, cidr string) []*multus.Element {
	e := findElement(elems, req.Namespace, n)
	if e == nil {
		e = multus.NewElement(n.NAD.Namespace, n.NAD.Name)
		elems = append(elems, e)
	}
	if e.Interface() == "" {
		e.SetString(multus.KeyInterface, n.Interface)
	}
	if old := elementIPs(e); len(old) > 0 && !(len(old) == 1 && old[0] == cidr) {
		req.Warn("kvnet replaced ips %v of the %s element with its allocation %s", old, n.NAD, cidr)
	}
	_ = e.Set(multus.KeyIPs, []string{cidr})
	return elems
}

func writeAnnotation(pod *corev1.Pod, elems []*multus.Element, token string) error {
	s, err := multus.Format(elems)
	if err != nil {
		return err
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[multus.NetworksAnnotation] = s
	if token != "" {
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[LabelReservation] = token
	}
	return nil
}

func podName(pod *corev1.Pod) string {
	if pod.Name != "" {
		return pod.Name
	}
	return pod.GenerateName
}

// forbidden refuses a pod kvnet cannot give an address; it is not a kvnet
// failure (the pool is empty or the operator's NAD is missing), so a 403.
func forbidden(msg string) error { return chain.RefuseForbidden(msg) }
