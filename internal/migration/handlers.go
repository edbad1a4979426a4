package migration

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// HandlerAddresses answers, from kvnet's allocation ConfigMaps, which
// in-cluster address kvnet gave the virt-handler on a node. The target
// migration proxy dials only that address: a VMI's status, which whoever
// creates the VMI can write, names the node, never the address dialled.
type HandlerAddresses struct {
	// Reader reads the allocation ConfigMaps (a cache of Namespace's
	// in-cluster pool).
	Reader client.Reader
	// Namespace is kvnet's, where the allocations live.
	Namespace string
}

// HandlerAddress is the bound in-cluster address of node's virt-handler;
// ok is false when kvnet gave that node none. Only node-bound allocations
// count: those are virt-handlers' (a synchronization controller's
// in-cluster address has no node).
func (h HandlerAddresses) HandlerAddress(ctx context.Context, node string) (addr netip.Addr, ok bool, err error) {
	if node == "" {
		return netip.Addr{}, false, nil
	}
	var cms corev1.ConfigMapList
	if err := h.Reader.List(ctx, &cms, client.InNamespace(h.Namespace), client.MatchingLabels{LabelPool: PoolInCluster}); err != nil {
		return netip.Addr{}, false, fmt.Errorf("listing in-cluster allocations: %w", err)
	}
	for i := range cms.Items {
		a, err := FromConfigMap(&cms.Items[i])
		if err != nil || a.Node != node || a.State != StateBound {
			continue
		}
		return a.Address, true, nil
	}
	return netip.Addr{}, false, nil
}
