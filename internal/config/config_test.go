package config

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/model/netattach"
)

func TestParseErrorsNameFieldAndLine(t *testing.T) {
	cases := map[string]struct {
		in    string
		line  string // "config line N"
		field string
	}{
		"unknown field": {
			in:   "networkRules:\n  - name: a\n    networks:\n      - name: x\n        nad: br\n        vlan: 3\n",
			line: "config line 6:", field: "networkRules[0].networks[0].vlan",
		},
		"unknown top-level field": {in: "kubeovn: {}\n", line: "config line 1:", field: `"kubeovn"`},
		"type error in a list": {
			in:   "networkRules:\n  - name: a\n    networks:\n      - name: x\n        nad: br\n        defaultRoute: yes-please\n",
			line: "config line 6:", field: "networkRules[0].networks[0].defaultRoute",
		},
		"type error in the second list element": {
			in: "networkRules:\n  - name: a\n    networks:\n      - name: x\n        nad: br\n        defaultRoute: true\n" +
				"  - name: b\n    networks:\n      - name: y\n        nad: br\n        defaultRoute: maybe\n",
			line: "config line 11:", field: "networkRules[1].networks[0].defaultRoute",
		},
		"type error on a map": {in: "kubeOVN:\n  legacyLiveMigration: \"true\"\n", line: "config line 2:", field: "kubeOVN.legacyLiveMigration"},
		"string for a list":   {in: "sriov:\n  resourcePrefixes: intel.com/\n", line: "config line 2:", field: "sriov.resourcePrefixes"},
		"bad binding": {
			in:   "networkRules:\n  - name: a\n    networks:\n      - name: x\n        nad: br\n        binding: Not_Valid\n",
			line: "config line 6:", field: "networkRules[0].networks[0].binding",
		},
		"bad NAD reference": {
			in:   "networkRules:\n  - name: a\n    networks:\n      - name: x\n        nad: a/b/c\n",
			line: "config line 5:", field: "networkRules[0].networks[0].nad",
		},
		"missing rule name points at the rule": {
			in:   "networkRules:\n  - networks:\n      - {name: x, nad: br}\n",
			line: "config line 2:", field: "networkRules[0].name",
		},
		"duplicate rule name": {
			in:   "networkRules:\n  - name: a\n    networks: [{name: x, nad: br}]\n  - name: a\n    networks: [{name: second, nad: br}]\n",
			line: "config line 4:", field: "networkRules[1].name",
		},
		"two default routes in a rule": {
			in:   "networkRules:\n  - name: a\n    networks:\n    - {name: x, nad: br, defaultRoute: true}\n    - {name: second, nad: br, defaultRoute: true}\n",
			line: "config line 5:", field: "networkRules[0].networks[1].defaultRoute",
		},
		"bad selector": {
			in:   "networkRules:\n  - name: a\n    vmSelector:\n      matchExpressions: [{key: a, operator: Bogus}]\n    networks: [{name: x, nad: br}]\n",
			line: "config line 3:", field: "networkRules[0].vmSelector",
		},
		"unknown resources.inject": {in: "resources:\n  inject: always\n", line: "config line 2:", field: "resources.inject"},
		"bad excluded namespace":   {in: "excludedNamespaces:\n  - ok\n  - Bad_NS\n", line: "config line 3:", field: "excludedNamespaces[1]"},
		"empty prefix":             {in: "vdpa:\n  resourcePrefixes: [\"\"]\n", line: "config line 2:", field: "vdpa.resourcePrefixes[0]"},
		"duplicate key":            {in: "networkRules:\n  - name: a\n    name: b\n    networks: [{name: x, nad: br}]\n", line: "line 3", field: `"name"`},
		"not YAML":                 {in: "networkRules: [\n", line: "line 1", field: "not valid YAML"},
		"default-network NAD without namespace": {
			in:   "persistentIPs:\n  primaryUDN:\n    enabled: true\n    defaultNetworkNAD: default\n",
			line: "config line 4:", field: "persistentIPs.primaryUDN.defaultNetworkNAD",
		},
		"default-network NAD not a name": {
			in:   "persistentIPs:\n  primaryUDN: {defaultNetworkNAD: ovn/Bad_Name}\n",
			line: "config line 2:", field: "persistentIPs.primaryUDN.defaultNetworkNAD",
		},
		"primaryUDN.enabled not a bool": {
			in:   "persistentIPs:\n  primaryUDN:\n    enabled: yes-please\n",
			line: "config line 3:", field: "persistentIPs.primaryUDN.enabled",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.in), "")
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", cfg)
			}
			if !strings.Contains(err.Error(), c.line) || !strings.Contains(err.Error(), c.field) {
				t.Fatalf("error %q: want %q and %q", err, c.line, c.field)
			}
		})
	}
}

func TestParseDefaults(t *testing.T) {
	for name, in := range map[string]string{"empty": "", "null": "null\n", "comment": "# nothing\n", "empty map": "{}"} {
		t.Run(name, func(t *testing.T) {
			c, err := Parse([]byte(in), "kvnet-system")
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"kube-system", "kvnet-system"}; !reflect.DeepEqual(c.ExcludedNamespaces, want) {
				t.Errorf("excluded = %v, want %v", c.ExcludedNamespaces, want)
			}
			if !reflect.DeepEqual(c.SRIOV.ResourcePrefixes, DefaultSRIOVPrefixes) || !reflect.DeepEqual(c.VDPA.ResourcePrefixes, DefaultVDPAPrefixes) {
				t.Errorf("prefixes = %v / %v", c.SRIOV.ResourcePrefixes, c.VDPA.ResourcePrefixes)
			}
			if c.VDPA.BindingPlugin != "vdpa" || c.KubeOVN.LegacyLiveMigration || !c.PersistentIPsEnabled() {
				t.Errorf("defaults: %+v", c)
			}
			// Primary-UDN persistent IPs are off unless asked for.
			if c.PrimaryUDNEnabled() || c.PersistentIPs.PrimaryUDN.DefaultNetworkNAD != DefaultNetworkNAD {
				t.Errorf("primaryUDN defaults: %+v, want off and %s", c.PersistentIPs.PrimaryUDN, DefaultNetworkNAD)
			}
			// The legacy claim annotation is written unless turned off:
			// OVN-Kubernetes still needs it where the element cannot go.
			if !c.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation() {
				t.Errorf("primaryUDN.legacyClaimAnnotation defaults to off")
			}
		})
	}
	c, err := Parse([]byte(`
excludedNamespaces: [infra]
networkRules:
  - name: r
    networks: [{name: x, nad: br}, {name: second, nad: ns/vf, binding: sriov}]
sriov: {resourcePrefixes: ["a.com/"]}
vdpa: {resourcePrefixes: ["b.com/"], bindingPlugin: jaguar}
kubeOVN: {legacyLiveMigration: true}
`), "kvnet")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"infra", "kvnet"}; !reflect.DeepEqual(c.ExcludedNamespaces, want) {
		t.Errorf("excluded = %v, want %v (the own namespace is always added, kube-system only by default)", c.ExcludedNamespaces, want)
	}
	if !c.Excluded("kvnet") || c.Excluded("kube-system") {
		t.Errorf("Excluded is wrong for %v", c.ExcludedNamespaces)
	}
	if got := []string{c.NetworkRules[0].Networks[0].Binding, c.NetworkRules[0].Networks[1].Binding}; !reflect.DeepEqual(got, []string{"auto", "sriov"}) {
		t.Errorf("bindings = %v, want auto (default), sriov", got)
	}
	if c.SRIOV.ResourcePrefixes[0] != "a.com/" || c.VDPA.BindingPlugin != "jaguar" || !c.KubeOVN.LegacyLiveMigration {
		t.Errorf("values lost: %+v", c)
	}
	for in, want := range map[string]bool{
		"persistentIPs: {primaryUDN: {enabled: true}}\n":                 true,
		"persistentIPs: {enabled: false, primaryUDN: {enabled: true}}\n": false, // needs persistent IPs on
		"persistentIPs: {primaryUDN: {enabled: false}}\n":                false,
	} {
		c, err := Parse([]byte(in), "")
		if err != nil || c.PrimaryUDNEnabled() != want {
			t.Errorf("%q: PrimaryUDNEnabled() = %v (%v), want %v", in, c != nil && c.PrimaryUDNEnabled(), err, want)
		}
	}
	for in, want := range map[string]bool{
		"persistentIPs: {primaryUDN: {enabled: true, legacyClaimAnnotation: false}}\n": false,
		"persistentIPs: {primaryUDN: {enabled: true, legacyClaimAnnotation: true}}\n":  true,
		"persistentIPs: {primaryUDN: {enabled: true}}\n":                               true,
	} {
		c, err := Parse([]byte(in), "")
		if err != nil || c.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation() != want {
			t.Errorf("%q: WriteLegacyClaimAnnotation() = %v (%v), want %v", in, c != nil && c.PersistentIPs.PrimaryUDN.WriteLegacyClaimAnnotation(), err, want)
		}
	}
	if _, err := Parse([]byte("persistentIPs: {primaryUDN: {legacyClaimAnnotation: \"no\"}}\n"), ""); err == nil || !strings.Contains(err.Error(), "legacyClaimAnnotation") {
		t.Errorf("a non-boolean legacyClaimAnnotation gave %v, want an error naming the field", err)
	}
	c, err = Parse([]byte("persistentIPs: {primaryUDN: {enabled: true, defaultNetworkNAD: openshift-ovn-kubernetes/default}}\n"), "")
	if err != nil || c.PersistentIPs.PrimaryUDN.DefaultNetworkNAD.String() != "openshift-ovn-kubernetes/default" {
		t.Errorf("defaultNetworkNAD not kept: %+v, %v", c, err)
	}
	// An explicitly empty list is kept empty: "exclude nothing".
	c, err = Parse([]byte("excludedNamespaces: []\n"), "")
	if err != nil || len(c.ExcludedNamespaces) != 0 {
		t.Errorf("excludedNamespaces: [] gave %v, %v", c.ExcludedNamespaces, err)
	}
}

// Default must not write through to the caller's slices: the Watcher's old
// config may still be serving requests.
func TestDefaultDoesNotAlias(t *testing.T) {
	in := Config{ExcludedNamespaces: make([]string, 1, 4), NetworkRules: []NetworkRule{{Name: "r", Networks: []Network{{Name: "x", NAD: netattach.RefOf("br")}}}}}
	in.ExcludedNamespaces[0] = "a"
	out := in.Default("own")
	out.ExcludedNamespaces[0] = "changed"
	if in.ExcludedNamespaces[0] != "a" || in.NetworkRules[0].Networks[0].Binding != "" {
		t.Fatalf("Default changed its input: %+v", in)
	}
	if len(in.ExcludedNamespaces[:cap(in.ExcludedNamespaces)]) > 1 && in.ExcludedNamespaces[:2][1] == "own" {
		t.Fatalf("Default appended into the caller's backing array")
	}
}

func TestRuleMatches(t *testing.T) {
	c, err := Parse([]byte(`
networkRules:
  - name: all
    networks: [{name: a, nad: br}]
  - name: ns
    namespaceSelector: {matchLabels: {team: x}}
    networks: [{name: b, nad: br}]
  - name: both
    namespaceSelector: {matchExpressions: [{key: team, operator: Exists}]}
    vmSelector: {matchLabels: {app: db}}
    networks: [{name: c, nad: br}]
`), "")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		ns, vm map[string]string
		want   []string
	}{
		{nil, nil, []string{"all"}},
		{map[string]string{"team": "x"}, nil, []string{"all", "ns"}},
		{map[string]string{"team": "y"}, map[string]string{"app": "db"}, []string{"all", "both"}},
		{map[string]string{"team": "x"}, map[string]string{"app": "db"}, []string{"all", "ns", "both"}},
	}
	for _, tc := range cases {
		var got []string
		for i := range c.NetworkRules {
			if c.NetworkRules[i].Matches(tc.ns, tc.vm) {
				got = append(got, c.NetworkRules[i].Name)
			}
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ns=%v vm=%v: matched %v, want %v", tc.ns, tc.vm, got, tc.want)
		}
	}
	// A rule built in code (not through Default) compiles its selector lazily.
	r := NetworkRule{VMSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}}
	if !r.Matches(nil, map[string]string{"a": "b"}) || r.Matches(nil, nil) {
		t.Error("uncompiled selector matches wrongly")
	}
}

func failures() float64  { return testutil.ToFloat64(reloads.WithLabelValues("failure")) }
func successes() float64 { return testutil.ToFloat64(reloads.WithLabelValues("success")) }

// reloadOK reads kvnet_config_last_reload_successful.
func reloadOK() float64 { return testutil.ToFloat64(lastReloadOK) }

// generations lists the sha256 labels kvnet_config_generation carries.
func generations(t *testing.T) []string {
	t.Helper()
	ch := make(chan prometheus.Metric, 10)
	generation.Collect(ch)
	close(ch)
	var out []string
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		if d.GetGauge().GetValue() != 1 {
			t.Fatalf("kvnet_config_generation = %v, want 1", d.GetGauge().GetValue())
		}
		for _, l := range d.GetLabel() {
			out = append(out, l.GetValue())
		}
	}
	return out
}

func TestWatcherReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kubeOVN: {legacyLiveMigration: true}\n")
	if _, err := NewWatcher(filepath.Join(dir, "missing.yaml"), "", logr.Discard()); err == nil {
		t.Fatal("NewWatcher accepted a missing file")
	}
	w, err := NewWatcher(path, "kvnet", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	first := w.Get()
	if !first.KubeOVN.LegacyLiveMigration || !first.Excluded("kvnet") {
		t.Fatalf("initial config: %+v", first)
	}
	firstGen := Generation([]byte("kubeOVN: {legacyLiveMigration: true}\n"))
	if g := generations(t); !reflect.DeepEqual(g, []string{firstGen}) || len(firstGen) != 16 {
		t.Fatalf("generation after start = %v, want [%s] (16 hex digits)", g, firstGen)
	}
	if reloadOK() != 1 {
		t.Fatalf("kvnet_config_last_reload_successful = %v after a good start, want 1", reloadOK())
	}

	f0, s0 := failures(), successes()
	write("kubeOVN: {legacyLiveMigration: maybe}\n")
	if err := w.Reload(); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("bad reload: err = %v, want a line-numbered error", err)
	}
	if w.Get() != first {
		t.Fatal("a bad reload replaced the config")
	}
	if got := failures() - f0; got != 1 {
		t.Fatalf("failure metric +%v, want +1", got)
	}
	// The same bad bytes on the next poll are not counted again, but the
	// replica still says it is not running what is on disk.
	if err := w.Reload(); err != nil || failures()-f0 != 1 {
		t.Fatalf("second poll of the same bad file: err %v, failures +%v", err, failures()-f0)
	}
	if reloadOK() != 0 {
		t.Fatalf("kvnet_config_last_reload_successful = %v while a bad file is on disk, want 0", reloadOK())
	}
	if g := generations(t); !reflect.DeepEqual(g, []string{firstGen}) {
		t.Fatalf("generation after a failed reload = %v, want the one in force [%s]", g, firstGen)
	}

	write("kubeOVN: {legacyLiveMigration: false}\n")
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if w.Get() == first || w.Get().KubeOVN.LegacyLiveMigration {
		t.Fatalf("good reload did not swap: %+v", w.Get())
	}
	if successes()-s0 != 1 {
		t.Fatalf("success metric +%v, want +1", successes()-s0)
	}
	if reloadOK() != 1 {
		t.Fatalf("kvnet_config_last_reload_successful = %v after a good reload, want 1", reloadOK())
	}
	if g, want := generations(t), Generation([]byte("kubeOVN: {legacyLiveMigration: false}\n")); !reflect.DeepEqual(g, []string{want}) || want == firstGen {
		t.Fatalf("generation after a good reload = %v, want only [%s]", g, want)
	}
	// Unchanged bytes: no swap, no count.
	cur := w.Get()
	if err := w.Reload(); err != nil || w.Get() != cur || successes()-s0 != 1 {
		t.Fatalf("reload of unchanged file swapped or counted")
	}
}

// Start picks up a change by itself (events or the poll), and stops with ctx.
func TestWatcherStart(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := NewWatcher(path, "", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	w.Poll = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	if err := os.WriteFile(path, []byte("vdpa: {bindingPlugin: other}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for w.Get().VDPA.BindingPlugin != "other" {
		if time.Now().After(deadline) {
			t.Fatal("the watcher never loaded the new file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after cancel")
	}
}

// FuzzParse: any bytes give a config or an error, never a panic; an accepted
// config is defaulted and valid.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"", "{}", "null", "[]", "a: b", "networkRules: [\n", "kubeOVN: {legacyLiveMigration: maybe}",
		"networkRules:\n  - name: a\n    networks:\n      - {name: x, nad: br, binding: sriov, defaultRoute: true}\n",
		"networkRules:\n  - name: a\n    namespaceSelector: {matchLabels: {a: b}}\n    vmSelector: {matchExpressions: [{key: k, operator: In, values: [v]}]}\n    networks: [{name: x, nad: ns/br}]\n",
		"excludedNamespaces: [a, b]\nsriov: {resourcePrefixes: [x/]}\nvdpa: {resourcePrefixes: [y/], bindingPlugin: v}\n",
		"networkRules: [{name: a, name: b}]", "&a [*a]", "? [a]\n: b", "\t", "- - - -", "networkRules: {a: 1}",
		"migration: {inCluster: {nad: m, pool: {cidr: 10.0.0.0/24}}}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "own")
		if err != nil {
			if c != nil {
				t.Fatal("config returned with an error")
			}
			return
		}
		if errs := Validate(c); len(errs) > 0 {
			t.Fatalf("accepted config does not validate: %v", errs)
		}
		if c.VDPA.BindingPlugin == "" || !c.Excluded("own") {
			t.Fatalf("accepted config is not defaulted: %+v", c)
		}
	})
}
