// Package lookup answers the questions admission asks about the cluster: what
// a NAD is, what labels a namespace has, how KubeVirt is configured. The
// webhook answers them from informer caches, the offline CLI from files; the
// mutators and validators cannot tell the difference.
package lookup

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/lru"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/peers"
)

// Facts is read-only cluster state. Implementations must be safe for
// concurrent use and must not call the API server per request.
type Facts interface {
	// NAD returns the parsed NAD ref names (resolved: a namespace and a
	// name), or nil (and no error) when it does not exist.
	NAD(ctx context.Context, ref netattach.Ref) (*netattach.Info, error)
	// NamespaceLabels returns the labels of a namespace; nil when it is unknown.
	NamespaceLabels(ctx context.Context, namespace string) (map[string]string, error)
	// KubeVirt returns the KubeVirt CR, or nil when none is visible.
	KubeVirt(ctx context.Context) (*kubevirtv1.KubeVirt, error)
	// PrimaryNetworks returns the NADs of a namespace that are
	// OVN-Kubernetes primary user-defined networks (netattach.Info.IsPrimaryUDN),
	// sorted by name. OVN-Kubernetes allows one per namespace; callers
	// decide what more than one means.
	PrimaryNetworks(ctx context.Context, namespace string) ([]*netattach.Info, error)
	// IPAMClaim returns the IPAMClaim, or nil (and no error) when it does
	// not exist or the cluster has no IPAMClaim CRD. Callers only read it.
	IPAMClaim(ctx context.Context, namespace, name string) (*ipamv1alpha1.IPAMClaim, error)
	// MigrationHolders returns the live VirtualMachineInstanceMigrations
	// (migrationid.Live) of every namespace that hold migration ID id in
	// role, sorted by namespace and name.
	MigrationHolders(ctx context.Context, role migrationid.Role, id string) ([]types.NamespacedName, error)
	// ResourceInjector names the network-resources-injector webhook
	// ("configuration/webhook") the API server calls for the CREATE of a
	// pod with podLabels in namespace, or "" when none is registered for
	// it (peers.ResourceInjectorFor).
	ResourceInjector(ctx context.Context, namespace string, podLabels map[string]string) (string, error)
	// IPAMExtensions names the kubevirt/ipam-extensions webhook
	// ("configuration/webhook") registered in the cluster, or ""
	// (peers.IPAMExtensionsIn).
	IPAMExtensions(ctx context.Context) (string, error)
	// MACPool is kubemacpool's VM webhook as the API server calls it for
	// a VM in namespace, relative to kvnet's own (peers.KubemacpoolFor);
	// the zero MACPool when none is registered for it.
	MACPool(ctx context.Context, namespace string) (peers.MACPool, error)
	// MACHolders are the VirtualMachines (not being deleted) whose
	// template interfaces ask for mac, or whose IPAMClaim keeps it as the
	// MAC of a network identity received in a cross-cluster migration.
	MACHolders(ctx context.Context, mac string) ([]MACHolder, error)
}

// Reader answers from a controller-runtime reader, normally the manager's
// cache, and remembers parsed NADs per resourceVersion so a NAD's JSON is
// decoded once, not once per request.
type Reader struct {
	client.Reader
	// parsed memoises parsed NADs by "ns/name". It is bounded (least
	// recently used go first) and drops a NAD found deleted, so a cluster
	// that churns NADs does not grow kvnet's memory; a miss costs one parse.
	parsed     *lru.Cache
	parsedOnce sync.Once
	// kubeVirt says how KubeVirt is answered: listed from Reader (a plain
	// reader), never there (no CRD), or from an informer WatchKubeVirt
	// started with the manager.
	kubeVirt kubeVirtSource
	// claimMACs: IndexClaimMACs indexed IPAMClaims by received MAC.
	claimMACs bool
}

type kubeVirtSource int

const (
	kubeVirtListed kubeVirtSource = iota
	kubeVirtAbsent
	kubeVirtWatched
)

// WatchKubeVirt starts the KubeVirt CR informer on c now, before the manager
// starts, so that it syncs with the others and /readyz covers it; without
// it, the first admission request needing the CR started the informer and
// waited for its sync inside the webhook timeout. A cluster without
// KubeVirt's CRD gets no informer, and KubeVirt answers nil without a call.
func (r *Reader) WatchKubeVirt(ctx context.Context, c cache.Informers) error {
	_, err := c.GetInformer(ctx, &kubevirtv1.KubeVirt{}, cache.BlockUntilSynced(false))
	switch {
	case meta.IsNoMatchError(err):
		r.kubeVirt = kubeVirtAbsent
	case err != nil:
		return fmt.Errorf("starting the KubeVirt CR informer: %w", err)
	default:
		r.kubeVirt = kubeVirtWatched
	}
	return nil
}

// NADMemoSize bounds the parsed-NAD memo: far more NADs than one cluster's
// VMs use, small next to the informer's own copy of them.
const NADMemoSize = 4096

// NewReader wraps r, which should be informer-backed.
func NewReader(r client.Reader) *Reader { return &Reader{Reader: r} }

func (r *Reader) memo() *lru.Cache {
	r.parsedOnce.Do(func() { r.parsed = lru.New(NADMemoSize) })
	return r.parsed
}

// NAD implements Facts.
func (r *Reader) NAD(ctx context.Context, ref netattach.Ref) (*netattach.Info, error) {
	var nad nadv1.NetworkAttachmentDefinition
	if err := r.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, &nad); err != nil {
		if apierrors.IsNotFound(err) {
			r.memo().Remove(ref.Namespace + "/" + ref.Name)
			return nil, nil
		}
		return nil, fmt.Errorf("reading NetworkAttachmentDefinition %s: %w", ref, err)
	}
	return r.parse(&nad), nil
}

// parse returns the memoised parse of nad when it is of the same
// resourceVersion, else parses and remembers it.
func (r *Reader) parse(nad *nadv1.NetworkAttachmentDefinition) *netattach.Info {
	key := nad.Namespace + "/" + nad.Name
	if v, ok := r.memo().Get(key); ok {
		if info := v.(*netattach.Info); info.ResourceVersion == nad.ResourceVersion {
			return info
		}
	}
	info := netattach.Parse(nad)
	r.memo().Add(key, info)
	return info
}

// PrimaryNetworks implements Facts. It lists the namespace's NADs from the
// cache (an index lookup, without copying them: they are only read) and
// parses each once per resourceVersion.
func (r *Reader) PrimaryNetworks(ctx context.Context, namespace string) ([]*netattach.Info, error) {
	var list nadv1.NetworkAttachmentDefinitionList
	if err := r.List(ctx, &list, client.InNamespace(namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing NetworkAttachmentDefinitions in %s: %w", namespace, err)
	}
	var out []*netattach.Info
	for i := range list.Items {
		if info := r.parse(&list.Items[i]); info.IsPrimaryUDN() {
			out = append(out, info)
		}
	}
	sortByName(out)
	return out, nil
}

func sortByName(infos []*netattach.Info) {
	slices.SortFunc(infos, func(a, b *netattach.Info) int { return strings.Compare(a.Name, b.Name) })
}

// IPAMClaim implements Facts, from the claim informer the persistent-IPs
// wiring starts with the manager.
func (r *Reader) IPAMClaim(ctx context.Context, namespace, name string) (*ipamv1alpha1.IPAMClaim, error) {
	var c ipamv1alpha1.IPAMClaim
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &c); err != nil {
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading IPAMClaim %s/%s: %w", namespace, name, err)
	}
	return &c, nil
}

// MigrationHolders implements Facts, from the VMIM informer's
// migrationid.IndexField index (which the wiring registers): an index
// lookup, not a list of every VMIM of the cluster.
func (r *Reader) MigrationHolders(ctx context.Context, role migrationid.Role, id string) ([]types.NamespacedName, error) {
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := r.List(ctx, &list, client.MatchingFields{migrationid.IndexField: migrationid.Key(role, id)}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the live VirtualMachineInstanceMigrations with %s %q: %w", role.Path(), id, err)
	}
	out := make([]types.NamespacedName, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, client.ObjectKeyFromObject(&list.Items[i]))
	}
	sortKeys(out)
	return out, nil
}

func sortKeys(keys []types.NamespacedName) {
	slices.SortFunc(keys, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
}

// NamespaceMetadata is how Reader reads namespaces: metadata only (labels
// are all it needs), so that a manager's cache holds a metadata-only
// informer on them. Start that informer with this object.
func NamespaceMetadata() *metav1.PartialObjectMetadata {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return ns
}

// NamespaceLabels implements Facts.
func (r *Reader) NamespaceLabels(ctx context.Context, namespace string) (map[string]string, error) {
	ns := NamespaceMetadata()
	if err := r.Get(ctx, client.ObjectKey{Name: namespace}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading namespace %s: %w", namespace, err)
	}
	return ns.Labels, nil
}

// KubeVirt implements Facts. A cluster without the KubeVirt CRD, or without a
// KubeVirt CR, yields nil: validators then skip the checks that need it.
func (r *Reader) KubeVirt(ctx context.Context) (*kubevirtv1.KubeVirt, error) {
	if r.kubeVirt == kubeVirtAbsent {
		return nil, nil
	}
	var list kubevirtv1.KubeVirtList
	if err := r.List(ctx, &list); err != nil {
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("listing KubeVirt CRs: %w", err)
	}
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			return &list.Items[i], nil
		}
	}
	return nil, nil
}

// ResourceInjector implements Facts from the MutatingWebhookConfiguration
// informer (serve.go starts it with the manager): the configurations are
// few, and listing them from the cache costs no API call.
func (r *Reader) ResourceInjector(ctx context.Context, namespace string, podLabels map[string]string) (string, error) {
	var list admissionregv1.MutatingWebhookConfigurationList
	if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return "", fmt.Errorf("listing MutatingWebhookConfigurations: %w", err)
	}
	if !slices.ContainsFunc(list.Items, mayBeResourceInjector) {
		return "", nil
	}
	nsLabels, err := r.NamespaceLabels(ctx, namespace)
	if err != nil {
		return "", err
	}
	slices.SortFunc(list.Items, func(a, b admissionregv1.MutatingWebhookConfiguration) int { return strings.Compare(a.Name, b.Name) })
	return peers.ResourceInjectorFor(list.Items, namespace, nsLabels, podLabels), nil
}

// IPAMExtensions implements Facts from the MutatingWebhookConfiguration
// informer.
func (r *Reader) IPAMExtensions(ctx context.Context) (string, error) {
	var list admissionregv1.MutatingWebhookConfigurationList
	if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return "", fmt.Errorf("listing MutatingWebhookConfigurations: %w", err)
	}
	return peers.IPAMExtensionsIn(list.Items), nil
}

// MACPool implements Facts from the MutatingWebhookConfiguration informer.
func (r *Reader) MACPool(ctx context.Context, namespace string) (peers.MACPool, error) {
	var list admissionregv1.MutatingWebhookConfigurationList
	if err := r.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return peers.MACPool{}, fmt.Errorf("listing MutatingWebhookConfigurations: %w", err)
	}
	if !slices.ContainsFunc(list.Items, mayBeKubemacpool) {
		return peers.MACPool{}, nil
	}
	nsLabels, err := r.NamespaceLabels(ctx, namespace)
	if err != nil {
		return peers.MACPool{}, err
	}
	slices.SortFunc(list.Items, func(a, b admissionregv1.MutatingWebhookConfiguration) int { return strings.Compare(a.Name, b.Name) })
	return peers.KubemacpoolFor(list.Items, namespace, nsLabels), nil
}

// mayBeKubemacpool spares the namespace lookup (and the sort) on the
// common path, a cluster without kubemacpool.
func mayBeKubemacpool(c admissionregv1.MutatingWebhookConfiguration) bool {
	return slices.ContainsFunc(c.Webhooks, func(w admissionregv1.MutatingWebhook) bool { return w.Name == peers.KubemacpoolVMWebhook })
}

// mayBeResourceInjector spares the namespace lookup (and the sort) on the
// common path, a cluster without network-resources-injector.
func mayBeResourceInjector(c admissionregv1.MutatingWebhookConfiguration) bool {
	return slices.ContainsFunc(c.Webhooks, func(w admissionregv1.MutatingWebhook) bool {
		return slices.Contains(peers.ResourceInjectorWebhooks, w.Name)
	})
}

// Snapshot is a fixed set of facts, used by the offline CLI and unit tests.
type Snapshot struct {
	NADs       map[string]*netattach.Info         // "ns/name"
	Claims     map[string]*ipamv1alpha1.IPAMClaim // "ns/name"; the offline CLI has none
	Namespaces map[string]map[string]string
	KubeVirtCR *kubevirtv1.KubeVirt
	// Migrations are the cluster's VMIMs; the offline CLI has none.
	Migrations []kubevirtv1.VirtualMachineInstanceMigration
	// Webhooks are the cluster's MutatingWebhookConfigurations, sorted by
	// name; the offline CLI has none.
	Webhooks []admissionregv1.MutatingWebhookConfiguration
	// VMs are the cluster's VirtualMachines, for MACHolders; the offline
	// CLI has none.
	VMs []kubevirtv1.VirtualMachine
}

// NewSnapshot builds a snapshot from typed objects.
func NewSnapshot(nads []nadv1.NetworkAttachmentDefinition, namespaces []corev1.Namespace, kv *kubevirtv1.KubeVirt) *Snapshot {
	s := &Snapshot{NADs: map[string]*netattach.Info{}, Namespaces: map[string]map[string]string{}, KubeVirtCR: kv}
	for i := range nads {
		info := netattach.Parse(&nads[i])
		s.NADs[info.Ref()] = info
	}
	for _, ns := range namespaces {
		s.Namespaces[ns.Name] = ns.Labels
	}
	return s
}

// NAD implements Facts.
func (s *Snapshot) NAD(_ context.Context, ref netattach.Ref) (*netattach.Info, error) {
	return s.NADs[ref.Namespace+"/"+ref.Name], nil
}

// NamespaceLabels implements Facts.
func (s *Snapshot) NamespaceLabels(_ context.Context, namespace string) (map[string]string, error) {
	return s.Namespaces[namespace], nil
}

// PrimaryNetworks implements Facts.
func (s *Snapshot) PrimaryNetworks(_ context.Context, namespace string) ([]*netattach.Info, error) {
	var out []*netattach.Info
	for _, info := range s.NADs {
		if info.Namespace == namespace && info.IsPrimaryUDN() {
			out = append(out, info)
		}
	}
	sortByName(out)
	return out, nil
}

// IPAMClaim implements Facts.
func (s *Snapshot) IPAMClaim(_ context.Context, namespace, name string) (*ipamv1alpha1.IPAMClaim, error) {
	return s.Claims[namespace+"/"+name], nil
}

// MigrationHolders implements Facts, with the index's own keys
// (migrationid.Keys), so that it answers as Reader does.
func (s *Snapshot) MigrationHolders(_ context.Context, role migrationid.Role, id string) ([]types.NamespacedName, error) {
	out := []types.NamespacedName{}
	key := migrationid.Key(role, id)
	for i := range s.Migrations {
		if slices.Contains(migrationid.Keys(&s.Migrations[i]), key) {
			out = append(out, client.ObjectKeyFromObject(&s.Migrations[i]))
		}
	}
	sortKeys(out)
	return out, nil
}

// ResourceInjector implements Facts.
func (s *Snapshot) ResourceInjector(_ context.Context, namespace string, podLabels map[string]string) (string, error) {
	return peers.ResourceInjectorFor(s.Webhooks, namespace, s.Namespaces[namespace], podLabels), nil
}

// IPAMExtensions implements Facts.
func (s *Snapshot) IPAMExtensions(context.Context) (string, error) {
	return peers.IPAMExtensionsIn(s.Webhooks), nil
}

// MACPool implements Facts.
func (s *Snapshot) MACPool(_ context.Context, namespace string) (peers.MACPool, error) {
	if !slices.ContainsFunc(s.Webhooks, mayBeKubemacpool) {
		return peers.MACPool{}, nil
	}
	return peers.KubemacpoolFor(s.Webhooks, namespace, s.Namespaces[namespace]), nil
}

// KubeVirt implements Facts.
func (s *Snapshot) KubeVirt(context.Context) (*kubevirtv1.KubeVirt, error) { return s.KubeVirtCR, nil }
