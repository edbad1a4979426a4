package migration

import (
	"testing"

	"github.com/kvnet/kvnet/internal/config"
)

// TestProxyPodsHoldCrossClusterAddresses: with the default selectors and
// holders, the synchronization controller gets crosscluster0 and
// (alsoInCluster) migration0, a virt-handler only migration0: the address
// count docs/migration-proxy.md states. A kvnet proxy pod holds addresses
// only once its own namespace and ServiceAccount are a holder (the chart
// adds them), and a look-alike of any role gets nothing.
func TestProxyPodsHoldCrossClusterAddresses(t *testing.T) {
	c := mustConfig(t, bothNetworks+`    holders:
    - {serviceAccount: kubevirt-synchronization-controller}
    - {namespace: kvnet-system, serviceAccount: kvnet-migration-proxy}
`)
	const kv = "kubevirt"
	for _, tc := range []struct {
		name          string
		pod           Pod
		want          int
		wantNotHolder string
	}{
		{"proxy", Pod{"kvnet-system", "kvnet-migration-proxy", role("kvnet-migration-proxy")}, 2, ""},
		{"sync", Pod{kv, config.DefaultSyncServiceAccount, role("virt-synchronization-controller")}, 2, ""},
		{"handler", Pod{kv, config.DefaultHandlerServiceAccount, role("virt-handler")}, 1, ""},
		{"tenant sync look-alike", Pod{"tenant", config.DefaultSyncServiceAccount, role("virt-synchronization-controller")}, 0, config.NotHolderNamespace},
		{"tenant handler look-alike", Pod{"tenant", "default", role("virt-handler")}, 0, config.NotHolderNamespace},
		{"handler with another account", Pod{kv, "default", role("virt-handler")}, 0, config.NotHolderServiceAccount},
		{"handler account claiming sync", Pod{kv, config.DefaultHandlerServiceAccount, role("virt-synchronization-controller")}, 0, config.NotHolderServiceAccount},
		{"proxy account in KubeVirt's namespace", Pod{kv, "kvnet-migration-proxy", role("kvnet-migration-proxy")}, 0, config.NotHolderServiceAccount},
	} {
		nets, notHolder := Networks(&c.Migration, tc.pod, kv)
		if len(nets) != tc.want || notHolder != tc.wantNotHolder {
			t.Errorf("%s: %d migration networks %+v (not holder %q), want %d (%q)", tc.name, len(nets), nets, notHolder, tc.want, tc.wantNotHolder)
		}
		if tc.name == "handler" && len(nets) == 1 && nets[0].Interface == "crosscluster0" {
			t.Errorf("a virt-handler got the cross-cluster network")
		}
	}
	// Without KubeVirt's namespace (no migration.namespace, no KubeVirt CR
	// yet) no default holder can be matched: nobody gets an address.
	if nets, why := Networks(&c.Migration, Pod{kv, config.DefaultHandlerServiceAccount, role("virt-handler")}, ""); len(nets) != 0 || why != config.NoKubeVirtNamespace {
		t.Errorf("without KubeVirt's namespace a handler got %+v (%q)", nets, why)
	}
}

func role(r string) map[string]string { return map[string]string{"kubevirt.io": r} }

// TestHolderNamespaces: the webhook's namespaceSelector lists the holders'
// namespaces when they are all known from the config, and nothing (select
// by admission only) when one is the KubeVirt CR's.
func TestHolderNamespaces(t *testing.T) {
	c := mustConfig(t, bothNetworks)
	if got := c.Migration.HolderNamespaces(); got != nil {
		t.Errorf("namespaces %v without migration.namespace, want nil", got)
	}
	c = mustConfig(t, bothNetworks+`    holders:
    - {serviceAccount: kubevirt-synchronization-controller}
    - {namespace: kvnet-system, serviceAccount: kvnet-migration-proxy}
  namespace: kubevirt
`)
	if got := c.Migration.HolderNamespaces(); len(got) != 2 || got[0] != "kubevirt" || got[1] != "kvnet-system" {
		t.Errorf("namespaces %v, want [kubevirt kvnet-system]", got)
	}
}
