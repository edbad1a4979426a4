package proxy

import (
	"context"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

var leasesMarked = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_proxy_leases_marked_total",
	Help: "IPAMClaims of VMs that moved to a peer cluster which this source proxy made leases of that peer (persistentips.MarkLeases), by peer.",
}, []string{"peer"})

// LeaseMarker turns the claims kvnet holds for a VM that moved to a peer
// cluster into leases of that peer (persistentips.MarkLeases), and reports
// how many it marked.
type LeaseMarker interface {
	MarkLeases(ctx context.Context, namespace, vm, peer string, route hop.Route) (int, error)
}

// markLeases makes leases of the claims of the VM behind key (a VMI's
// namespace and name, which are its VM's) for each of its sending VMIMs
// that succeeded: the VM runs in the peer cluster now, with the same IPs,
// and the source cluster must not give them to another VM when this one
// is deleted. It runs whether or not the VMI still exists (after a move,
// KubeVirt deletes it).
func (c *Controller) markLeases(ctx context.Context, log logr.Logger, key types.NamespacedName) error {
	if c.Leases == nil {
		return nil
	}
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := c.Client.List(ctx, &list, client.InNamespace(key.Namespace)); err != nil {
		return err
	}
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.SendTo == nil || m.Spec.VMIName != key.Name || m.Status.Phase != kubevirtv1.MigrationSucceeded {
			continue
		}
		if _, done := c.leased.Load(m.UID); done {
			continue
		}
		peer, err := PeerFor(c.Peers, m.Spec.SendTo.ConnectURL)
		if err != nil {
			log.Error(err, "a VM moved to a cluster no peer proxy serves: its claims are not made leases", "vmim", m.Name)
			continue
		}
		route, err := RouteOf(&kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}, m)
		if err != nil {
			log.Error(err, "a VM moved on a route kvnet cannot read: its claims are not made leases", "vmim", m.Name)
			continue
		}
		n, err := c.Leases.MarkLeases(ctx, key.Namespace, key.Name, peer.Name, route)
		if n > 0 {
			leasesMarked.WithLabelValues(peer.Name).Add(float64(n))
			log.Info("the VM moved to a peer cluster: its claims are leases of that peer now", "vmim", m.Name, "peer", peer.Name, "migrationID", m.Spec.SendTo.MigrationID, "claims", n)
		}
		if err != nil {
			return err
		}
		c.leased.Store(m.UID, struct{}{})
	}
	return nil
}
