package webhook_test

import (
	"slices"
	"testing"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/webhook"
)

// A pod webhook fails closed on the pods it selects, so it is registered only
// when a configured feature needs it: with no migration network, a kvnet
// outage must not stop virt-handler pods cluster-wide, and with neither
// persistent IPs nor kube-ovn's legacy migration, not launcher pods either.
// (Before Registration.For, both were always registered: every row but the
// last failed.)
func TestPodWebhooksOnlyWhenConfigNeedsThem(t *testing.T) {
	vmHooks := []string{"virtualmachines.mutate.kvnet.io", "virtualmachineinstances.mutate.kvnet.io"}
	for name, c := range map[string]struct {
		yaml string
		want []string
	}{
		"persistent IPs off, nothing else": {"persistentIPs: {enabled: false}\nresources: {inject: never}", vmHooks},
		"persistent IPs off, resources injected (the default)": {`persistentIPs: {enabled: false}`,
			append(slices.Clone(vmHooks), "launcher-pods.mutate.kvnet.io")},
		"persistent IPs on (the default)": {``, append(slices.Clone(vmHooks), "launcher-pods.mutate.kvnet.io")},
		"kube-ovn legacy migration only": {"persistentIPs: {enabled: false}\nresources: {inject: never}\nkubeOVN: {legacyLiveMigration: true}",
			append(slices.Clone(vmHooks), "launcher-pods.mutate.kvnet.io")},
		"a migration network, persistent IPs off": {"persistentIPs: {enabled: false}\nresources: {inject: never}\nmigration: {inCluster: {nad: kubevirt/migration, pool: {cidr: 10.10.0.0/24}}}",
			append(slices.Clone(vmHooks), "migration-pods.mutate.kvnet.io")},
		"everything": {"kubeOVN: {legacyLiveMigration: true}\nmigration: {inCluster: {nad: kubevirt/migration, pool: {cidr: 10.10.0.0/24}}}",
			append(slices.Clone(vmHooks), "launcher-pods.mutate.kvnet.io", "migration-pods.mutate.kvnet.io")},
	} {
		t.Run(name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(c.yaml), "kvnet-system")
			if err != nil {
				t.Fatal(err)
			}
			m, v := webhook.Registration{ServiceNamespace: "kvnet-system", ServiceName: "kvnet"}.For(cfg).Configurations()
			var got []string
			for _, h := range m.Webhooks {
				got = append(got, h.Name)
				if h.ReinvocationPolicy == nil || *h.ReinvocationPolicy != "IfNeeded" {
					t.Errorf("%s: reinvocationPolicy %v, want IfNeeded (network-resources-injector mutates after kvnet)", h.Name, h.ReinvocationPolicy)
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("mutating webhooks %v, want %v", got, c.want)
			}
			if len(v.Webhooks) != 3 {
				t.Errorf("%d validating webhooks, want the VM, VMI and VMIM ones", len(v.Webhooks))
			}
		})
	}
}
