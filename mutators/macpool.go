package mutators

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/peers"
)

// macsMissed counts the interfaces kvnet added to VMs that a MAC pool
// registered for them does not see.
var macsMissed = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_vm_interfaces_missed_by_mac_pool_total",
	Help: "Interfaces kvnet added to VirtualMachines that the MAC pool webhook registered for them (kubemacpool) does not see, because the API server calls it before kvnet and not again: they get no MAC from the pool (one per interface and request), by peer.",
}, []string{"peer"})

// MACPool says what becomes of the MACs of the interfaces kvnet adds to a
// VM where kubemacpool gives VMs their MACs. kvnet gives none itself: a
// MAC pool's MACs are unique because the pool hands them all out. Where
// the pool sees the interfaces (the API server calls it after kvnet, or
// again after kvnet changed the VM, reinvocationPolicy IfNeeded), kvnet
// leaves their MACs to it (kvnet.io/mutations "leftTo"). Where it does
// not (kubemacpool as it ships: its configuration's name sorts before
// kvnet's, and its policy is Never), the interfaces would run with MACs
// the CNI picks anew at each start; kvnet says so in kvnet.io/mutations
// ("missedBy"), in an admission warning naming the fix, in
// kvnet_vm_interfaces_missed_by_mac_pool_total and in a log line.
//
// It runs after every mutator that adds interfaces, and looks only at the
// interfaces added in this request that still have no macAddress (a MAC
// asked for in kvnet.io/networks is the interface's own: Addresses).
type MACPool struct{}

// Name implements chain.VMMutator.
func (MACPool) Name() string { return "mac-pool" }

// Mutate implements chain.VMMutator.
func (m MACPool) Mutate(ctx context.Context, req *chain.Request) error {
	var bare []string
	for _, c := range req.Changes {
		if c.Mutator != (NetworkInjector{}).Name() {
			continue
		}
		for _, n := range c.Networks {
			if _, iface := req.Interface(n); iface != nil && iface.MacAddress == "" {
				bare = append(bare, n)
			}
		}
	}
	if len(bare) == 0 {
		return nil // the common path: nothing added, no lookup
	}
	pool, err := req.Facts.MACPool(ctx, req.Namespace)
	if err != nil || pool.Webhook == "" {
		return err
	}
	if pool.SeesKvnetInterfaces() {
		req.RecordLeftTo(m.Name(), peers.Kubemacpool, bare...)
		return nil
	}
	macsMissed.WithLabelValues(peers.Kubemacpool).Add(float64(len(bare)))
	logf.FromContext(ctx).Info("kubemacpool does not see the interfaces kvnet added: they get no MAC from its pool",
		"namespace", req.Namespace, "name", req.Name, "webhook", pool.Webhook, "networks", bare)
	req.Warn("interfaces %v get no MAC from kubemacpool: its webhook %s runs before kvnet's and is not called again; set its reinvocationPolicy to IfNeeded (docs/peers.md, kubemacpool)", bare, pool.Webhook)
	req.RecordMissedBy(m.Name(), peers.Kubemacpool, bare...)
	return nil
}
