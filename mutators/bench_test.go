package mutators_test

import (
	"context"
	"testing"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
)

// BenchmarkDefaultChain runs the mutator chain alone (no decoding, no
// patch) on a VM that gains four Multus networks (next to the pod network
// the chain writes out): the cost of kvnet's own logic.
func BenchmarkDefaultChain(b *testing.B) {
	cfg := mustConfig(b, rulesConfig+"kubeOVN: {legacyLiveMigration: true}\n")
	const vm = `
metadata:
  name: vm1
  labels: {app: db}
  annotations: {kvnet.io/networks: '[{"name":"ovn","nad":"ovn","defaultRoute":true},{"name":"dp","nad":"vd"}]'}
spec:
  template:
    spec:
      domain: {devices: {}}
`
	ctx := context.Background()
	ms := app.Chains(app.Capabilities{}).VM
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		_, req := vmRequest(b, vm, cfg)
		b.StartTimer()
		if err := chain.RunVMMutators(ctx, req, ms); err != nil {
			b.Fatal(err)
		}
		multusNets := 0
		for _, n := range req.Spec.Networks {
			if n.Multus != nil {
				multusNets++
			}
		}
		if multusNets != 4 || len(req.Spec.Networks) != 5 {
			b.Fatalf("networks = %d (%d Multus), want the pod network and 4 Multus", len(req.Spec.Networks), multusNets)
		}
	}
}
