package mutators_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/mutators"
)

func TestKubeOVN(t *testing.T) {
	cases := map[string]struct {
		networks     string // spec.networks
		templateAnno string
		defaultRoute []string
		config       string
		wantAnno     map[string]string
		wantWarnings int
		wantWarning  string   // in the warnings, when set
		wantNetworks []string // recorded
	}{
		"default provider <nad>.<ns>.ovn gets the default route": {
			networks:     "[{name: a, multus: {networkName: ovn}}, {name: b, multus: {networkName: ovn2}}]",
			defaultRoute: []string{"a"},
			wantAnno:     map[string]string{"ovn.tenant-a.ovn.kubernetes.io/default_route": "true"},
			wantNetworks: []string{"a"},
		},
		"provider from the NAD config": {
			networks:     "[{name: a, multus: {networkName: tenant-a/ovnp}}]",
			defaultRoute: []string{"a"},
			wantAnno:     map[string]string{"custom.prov.kubernetes.io/default_route": "true"},
			wantNetworks: []string{"a"},
		},
		"legacy live migration flags every kube-ovn attachment": {
			networks:     "[{name: a, multus: {networkName: ovn}}, {name: b, multus: {networkName: ovnp}}, {name: c, multus: {networkName: br}}]",
			defaultRoute: []string{"b"},
			config:       "kubeOVN: {legacyLiveMigration: true}",
			wantAnno: map[string]string{
				"ovn.tenant-a.ovn.kubernetes.io/allow_live_migration": "true",
				"custom.prov.kubernetes.io/allow_live_migration":      "true",
				"custom.prov.kubernetes.io/default_route":             "true",
			},
			wantWarnings: 1, // kube-ovn >= 1.13 ignores the flag: one warning for both networks
			wantWarning:  "network a, b: allow_live_migration (kubeOVN.legacyLiveMigration) is read only by kube-ovn <= v1.12",
			wantNetworks: []string{"a", "b"},
		},
		"allow_live_migration the user set is kept and warned about": {
			networks:     "[{name: a, multus: {networkName: ovn}}, {name: c, multus: {networkName: br}}]",
			templateAnno: "{ovn.tenant-a.ovn.kubernetes.io/allow_live_migration: 'true'}",
			wantAnno:     map[string]string{"ovn.tenant-a.ovn.kubernetes.io/allow_live_migration": "true"},
			wantWarnings: 1,
			wantWarning:  "network a: allow_live_migration",
		},
		"no default route asked: nothing": {
			networks: "[{name: a, multus: {networkName: ovn}}]",
		},
		"a value the user set is kept": {
			networks:     "[{name: a, multus: {networkName: ovn}}]",
			templateAnno: "{ovn.tenant-a.ovn.kubernetes.io/default_route: 'false'}",
			defaultRoute: []string{"a"},
			wantAnno:     map[string]string{"ovn.tenant-a.ovn.kubernetes.io/default_route": "false"},
		},
		"default route on a non-kube-ovn network is a warning": {
			networks:     "[{name: a, multus: {networkName: br}}]",
			defaultRoute: []string{"a"},
			wantWarnings: 1,
		},
		"default route on a missing NAD is a warning": {
			networks:     "[{name: a, multus: {networkName: gone}}]",
			defaultRoute: []string{"a"},
			wantWarnings: 1,
		},
		"malformed reference is left for the validator": {
			networks: "[{name: a, multus: {networkName: 'A/b/c'}}]",
			config:   "kubeOVN: {legacyLiveMigration: true}",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg := c.config
			if cfg == "" {
				cfg = "{}"
			}
			anno := ""
			if c.templateAnno != "" {
				anno = "metadata: {annotations: " + c.templateAnno + "}"
			}
			_, req := vmRequest(t, `
metadata: {name: vm1}
spec:
  template:
    `+anno+`
    spec:
      networks: `+c.networks+`
`, mustConfig(t, cfg))
			for _, n := range c.defaultRoute {
				req.MarkDefaultRoute(n)
			}
			if err := (mutators.KubeOVN{}).Mutate(context.Background(), req); err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			got := req.TemplateMeta.Annotations
			if len(got) == 0 && len(c.wantAnno) == 0 {
				got = nil
			}
			want := c.wantAnno
			if !reflect.DeepEqual(got, want) {
				t.Errorf("template annotations = %v, want %v", got, want)
			}
			if len(req.Warnings) != c.wantWarnings {
				t.Errorf("warnings = %q, want %d", req.Warnings, c.wantWarnings)
			}
			if c.wantWarning != "" && !strings.Contains(strings.Join(req.Warnings, "\n"), c.wantWarning) {
				t.Errorf("warnings = %q, want one saying %q", req.Warnings, c.wantWarning)
			}
			var recorded []string
			for _, ch := range req.Changes {
				recorded = append(recorded, ch.Networks...)
			}
			if !reflect.DeepEqual(recorded, c.wantNetworks) {
				t.Errorf("recorded %v, want %v", recorded, c.wantNetworks)
			}
		})
	}
}
