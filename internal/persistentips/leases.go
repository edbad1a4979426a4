package persistentips

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/kvnet/kvnet/internal/model/owner"
)

// A claim whose VM moved to another cluster is a lease: on a network
// stretched across both clusters its IPs are live there, so the source
// cluster must not give them to a new VM. The source proxy marks the
// moved VM's claims when the sending VMIM succeeds (MarkLeases); the claim
// controller then keeps kvnet's finalizer on them when the VM is deleted,
// until the lease is released.
const (
	// LeasePeerAnnotation names the peer cluster the VM moved to.
	LeasePeerAnnotation = "kvnet.io/lease-peer"
	// LeaseMigrationAnnotation is the migration ID of the move.
	LeaseMigrationAnnotation = "kvnet.io/lease-migration-id"
	// LeaseTargetAnnotation is the VM the migration moved the VM to, in the
	// peer cluster (namespace/name), which the lease check asks about.
	LeaseTargetAnnotation = "kvnet.io/lease-target"
	// LeaseSinceAnnotation is when the lease began (RFC 3339).
	LeaseSinceAnnotation = "kvnet.io/lease-since"
	// LeaseReleaseAnnotation, set by an operator on a leased claim whose VM
	// is gone here (its value says why), releases the lease: the claim
	// controller removes kvnet's finalizer. Setting it takes patch on
	// ipamclaims, which the chart gives namespace admins (its
	// aggregate-to-admin role), not tenants (edit).
	LeaseReleaseAnnotation = "kvnet.io/lease-release"
)

// LeaseReleaseRule is the rule the chart's <fullname>-lease-release
// ClusterRole grants namespace admins (aggregate-to-admin): what setting
// LeaseReleaseAnnotation takes. test/chart checks the chart against it.
var LeaseReleaseRule = rbacv1.PolicyRule{APIGroups: []string{ipamv1alpha1.SchemeGroupVersion.Group}, Resources: []string{"ipamclaims"}, Verbs: []string{"get", "list", "patch"}}

// Lease is what a leased claim says of its lease.
type Lease struct {
	Peer, MigrationID string
	// Target is the receiving VM in the peer cluster, namespace/name.
	Target string
	Since  time.Time
}

// LeaseOf reads c's lease; ok is false when c is not leased.
func LeaseOf(c *ipamv1alpha1.IPAMClaim) (l Lease, ok bool) {
	peer, ok := c.Annotations[LeasePeerAnnotation]
	if !ok {
		return Lease{}, false
	}
	since, _ := time.Parse(time.RFC3339, c.Annotations[LeaseSinceAnnotation])
	return Lease{Peer: peer, MigrationID: c.Annotations[LeaseMigrationAnnotation], Target: c.Annotations[LeaseTargetAnnotation], Since: since}, true
}

// MarkLeases makes the claims kvnet holds for VM namespace/vm leases of
// peer, for the move migrationID to VM target (namespace/name) there:
// those controlled by the VM and carrying kvnet's finalizer. A claim already leased for that move is left as it is
// (the proxy marks again after a restart). r lists the claims, c patches
// them. It returns how many it marked.
func MarkLeases(ctx context.Context, r client.Reader, c client.Client, namespace, vm, peer, migrationID, target string, now time.Time) (int, error) {
	var list ipamv1alpha1.IPAMClaimList
	if err := r.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return 0, fmt.Errorf("listing the IPAMClaims of %s/%s: %w", namespace, vm, err)
	}
	marked := 0
	for i := range list.Items {
		claim := &list.Items[i]
		ref := metav1.GetControllerOf(claim)
		if ref == nil || ref.Kind != owner.KindVM || ref.Name != vm || !controllerutil.ContainsFinalizer(claim, Finalizer) {
			continue
		}
		if l, ok := LeaseOf(claim); ok && l.MigrationID == migrationID && l.Peer == peer {
			continue
		}
		patch := client.MergeFrom(claim.DeepCopy())
		if claim.Annotations == nil {
			claim.Annotations = map[string]string{}
		}
		claim.Annotations[LeasePeerAnnotation] = peer
		claim.Annotations[LeaseMigrationAnnotation] = migrationID
		claim.Annotations[LeaseTargetAnnotation] = target
		claim.Annotations[LeaseSinceAnnotation] = now.UTC().Format(time.RFC3339)
		if err := c.Patch(ctx, claim, patch); err != nil {
			return marked, fmt.Errorf("marking IPAMClaim %s/%s a lease of %s: %w", claim.Namespace, claim.Name, peer, err)
		}
		marked++
	}
	return marked, nil
}

// LeaseGroup is the kept leases of one move: the claims of one VM,
// leased to one peer for one migration.
type LeaseGroup struct {
	Lease
	// Namespace and VM are the VM that moved (the claims' owner here).
	Namespace, VM string
	Claims        []types.NamespacedName
}

// KeptLeases lists, from r, the leases kvnet keeps (its finalizer on) that
// nobody has released yet, grouped by move.
func KeptLeases(ctx context.Context, r client.Reader) ([]LeaseGroup, error) {
	var list ipamv1alpha1.IPAMClaimList
	if err := r.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing IPAMClaims: %w", err)
	}
	index := map[string]int{}
	var out []LeaseGroup
	for i := range list.Items {
		c := &list.Items[i]
		l, ok := LeaseOf(c)
		ref := metav1.GetControllerOf(c)
		if !ok || ref == nil || !controllerutil.ContainsFinalizer(c, Finalizer) || c.Annotations[LeaseReleaseAnnotation] != "" {
			continue
		}
		key := strings.Join([]string{l.Peer, l.MigrationID, l.Target, c.Namespace, ref.Name}, "\x00")
		j, seen := index[key]
		if !seen {
			j = len(out)
			index[key] = j
			out = append(out, LeaseGroup{Lease: l, Namespace: c.Namespace, VM: ref.Name})
		}
		out[j].Claims = append(out[j].Claims, types.NamespacedName{Namespace: c.Namespace, Name: c.Name})
	}
	return out, nil
}

// ReleaseLeases asks the claim controller to release claims, as an
// operator does: LeaseReleaseAnnotation set to why.
func ReleaseLeases(ctx context.Context, c client.Client, claims []types.NamespacedName, why string) error {
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, LeaseReleaseAnnotation, why))
	for _, k := range claims {
		claim := &ipamv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
		if err := c.Patch(ctx, claim, client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("releasing the lease of IPAMClaim %s: %w", k, err)
		}
	}
	return nil
}

// HoldsIPs reports whether one of the claims vm controls, not being
// deleted, holds IPs: what a peer's lease check asks of a VM that moved
// here.
func HoldsIPs(ctx context.Context, r client.Reader, vm *kubevirtv1.VirtualMachine) (bool, error) {
	var list ipamv1alpha1.IPAMClaimList
	if err := r.List(ctx, &list, client.InNamespace(vm.Namespace)); err != nil {
		return false, fmt.Errorf("listing the IPAMClaims of %s/%s: %w", vm.Namespace, vm.Name, err)
	}
	for i := range list.Items {
		c := &list.Items[i]
		if ref := metav1.GetControllerOf(c); ref != nil && ref.UID == vm.UID && c.DeletionTimestamp == nil && len(c.Status.IPs) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// leaseBook is the leases the claim controller keeps, by VM, for the
// held-leases metrics.
type leaseBook struct {
	mu    sync.Mutex
	byKey map[string][]Lease
}

var leases = &leaseBook{byKey: map[string][]Lease{}}

// set records the leases kept for one VM (none: forget it).
func (b *leaseBook) set(key string, ls []Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(ls) == 0 {
		delete(b.byKey, key)
		return
	}
	b.byKey[key] = ls
}

var (
	leasesHeldDesc = prometheus.NewDesc("kvnet_persistentips_leases_held",
		"IPAMClaims kept as leases of a peer cluster: the VM moved there, so its IPs stay held here until the peer says it no longer holds them or an operator releases them, by peer.",
		[]string{"peer"}, nil)
	oldestLeaseDesc = prometheus.NewDesc("kvnet_persistentips_oldest_lease_age_seconds",
		"Age of the oldest lease kept for a peer cluster, by peer.",
		[]string{"peer"}, nil)
)

// ValueType is the type of every series b exports, for the generated
// metrics reference (docs/metrics.md).
func (b *leaseBook) ValueType() prometheus.ValueType { return prometheus.GaugeValue }

// Describe implements prometheus.Collector.
func (b *leaseBook) Describe(ch chan<- *prometheus.Desc) {
	ch <- leasesHeldDesc
	ch <- oldestLeaseDesc
}

// Collect implements prometheus.Collector.
func (b *leaseBook) Collect(ch chan<- prometheus.Metric) {
	b.mu.Lock()
	count, oldest := map[string]int{}, map[string]time.Time{}
	for _, ls := range b.byKey {
		for _, l := range ls {
			count[l.Peer]++
			if o, ok := oldest[l.Peer]; !ok || l.Since.Before(o) {
				oldest[l.Peer] = l.Since
			}
		}
	}
	b.mu.Unlock()
	peers := make([]string, 0, len(count))
	for p := range count {
		peers = append(peers, p)
	}
	sort.Strings(peers)
	now := time.Now()
	for _, p := range peers {
		ch <- prometheus.MustNewConstMetric(leasesHeldDesc, prometheus.GaugeValue, float64(count[p]), p)
		ch <- prometheus.MustNewConstMetric(oldestLeaseDesc, prometheus.GaugeValue, now.Sub(oldest[p]).Seconds(), p)
	}
}
