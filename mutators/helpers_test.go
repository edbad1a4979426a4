package mutators_test

import (
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/chain/chaintest"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/config/configtest"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/lookup/lookuptest"
)

const ns = "tenant-a"

// testFacts is one small cluster: a NAD of every kind kvnet tells apart.
func testFacts() *lookup.Snapshot {
	s := lookuptest.Facts(
		nadInfo(ns, "br", "", `{"cniVersion":"0.4.0","name":"br","type":"bridge"}`),
		nadInfo(ns, "vf", "intel.com/sriov_netdevice", `{"cniVersion":"0.4.0","name":"vf","type":"sriov"}`),
		nadInfo(ns, "vd", "jaguarmicro.com/jaguar", `{"cniVersion":"0.4.0","name":"vd","type":"sriov"}`),
		nadInfo(ns, "ovn", "", `{"cniVersion":"0.3.0","type":"kube-ovn"}`),
		nadInfo(ns, "ovnp", "", `{"cniVersion":"0.3.0","type":"kube-ovn","provider":"custom.prov"}`),
		nadInfo(ns, "ovn2", "", `{"cniVersion":"0.3.0","type":"kube-ovn"}`),
		nadInfo("shared", "br2", "", `{"cniVersion":"0.4.0","name":"br2","type":"bridge"}`),
		nadInfo("other", "br", "", `{"cniVersion":"0.4.0","name":"br","type":"bridge"}`),
	)
	s.Namespaces = map[string]map[string]string{
		ns:      {"env": "prod"},
		"other": {"env": "dev"},
	}
	return s
}

// nadInfo parses a NAD the way the webhook's cache does.
var nadInfo = lookuptest.NAD

func mustConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	return configtest.Must(t, y, "kvnet-system")
}

// vmRequest builds the chain request the webhook builds for a VM.
func vmRequest(t testing.TB, vmYAML string, cfg *config.Config) (*kubevirtv1.VirtualMachine, *chain.Request) {
	t.Helper()
	vm, req := chaintest.VM(t, vmYAML, ns)
	req.Config, req.Facts = cfg, testFacts()
	return vm, req
}
