package chart

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/test/framework"
)

// alertsValues renders every alert group: self-managed certificates (the
// default) and the migration proxy on.
const alertsValues = `
monitoring: {prometheusRule: {enabled: true}}
migrationProxy: {enabled: true, sidecar: {enabled: false}, allowedSources: [10.200.0.0/24]}
`

// ruleGroups is the part of a PrometheusRule (and of a Prometheus rule file)
// the tests read.
type ruleGroups struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func (g ruleGroups) alerts() []string {
	var out []string
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			if r.Alert != "" {
				out = append(out, r.Alert)
			}
		}
	}
	return out
}

// find returns the rendered objects of a kind.
func find(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// renderedRules renders the chart with values and returns the spec of its
// PrometheusRule as a Prometheus rule file.
func renderedRules(t *testing.T, values string) ([]byte, ruleGroups) {
	t.Helper()
	rules := find(render(t, chartCase{release: "kvnet", namespace: "kvnet-system", values: values}), "PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules rendered, want 1", len(rules))
	}
	spec, err := yaml.Marshal(rules[0].Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	var g ruleGroups
	if err := yaml.Unmarshal(spec, &g); err != nil {
		t.Fatal(err)
	}
	return spec, g
}

func promtool(t *testing.T) string {
	t.Helper()
	p, err := framework.PrometheusTool("promtool")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The rendered rules pass `promtool check rules`, and the unit tests of
// testdata/alerts.test.yaml pass against them with the default thresholds.
// Every alert has a case that fires it and one that keeps it quiet, and a
// runbook section in docs/operations.md that its runbook_url points to.
func TestAlertRules(t *testing.T) {
	spec, groups := renderedRules(t, alertsValues)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "alerts.test.yaml"}} {
		cmd := exec.Command(promtool(t), args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	var unit struct {
		Tests []struct {
			Name  string `json:"name"`
			Cases []struct {
				Alert     string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &unit); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range unit.Tests {
		for _, c := range tc.Cases {
			if len(c.ExpAlerts) > 0 {
				fires[c.Alert] = true
			} else {
				quiet[c.Alert] = true
			}
		}
	}
	alerts := groups.alerts()
	if len(alerts) < 12 {
		t.Fatalf("only %d alerts rendered: %v", len(alerts), alerts)
	}
	runbooks := runbookAnchors(t)
	for _, a := range alerts {
		if !fires[a] || !quiet[a] {
			t.Errorf("alert %s: unit test that fires it %v, that keeps it quiet %v; want both", a, fires[a], quiet[a])
		}
	}
	for _, grp := range groups.Groups {
		for _, r := range grp.Rules {
			url := r.Annotations["runbook_url"]
			base, anchor, ok := strings.Cut(url, "#")
			if !ok || base != "https://github.com/kvnet/kvnet/blob/main/docs/operations.md" || anchor != strings.ToLower(r.Alert) {
				t.Errorf("alert %s: runbook_url %q, want docs/operations.md#%s", r.Alert, url, strings.ToLower(r.Alert))
			}
			if !runbooks[anchor] {
				t.Errorf("alert %s: docs/operations.md has no section %q", r.Alert, r.Alert)
			}
			if r.Labels["severity"] != "critical" && r.Labels["severity"] != "warning" {
				t.Errorf("alert %s: severity %q", r.Alert, r.Labels["severity"])
			}
		}
	}
}

// runbookAnchors lists the GitHub anchors of docs/operations.md's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^a-z0-9 -]`)
	out := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if title, ok := strings.CutPrefix(line, "#"); ok {
			title = strings.TrimSpace(strings.TrimLeft(title, "#"))
			out[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(title), ""), " ", "-")] = true
		}
	}
	return out
}

// Off by default; on, the groups follow the rest of the values: no
// certificate alerts in cert-manager mode (cert-manager has its own), no
// proxy alerts without the proxy, thresholds and windows from values.
func TestAlertRulesFollowValues(t *testing.T) {
	objs := render(t, chartCase{release: "kvnet", namespace: "kvnet-system"})
	if n := len(find(objs, "PrometheusRule")); n != 0 {
		t.Fatalf("defaults render %d PrometheusRules, want none", n)
	}
	_, g := renderedRules(t, `
monitoring:
  prometheusRule:
    enabled: true
    job: kvnet-metrics
    rateWindow: 2m
    alertLabels: {team: network}
    migrationPoolNearlyFull: {ratio: 0.75, for: 30m}
certs: {mode: cert-manager}
webhooks: {timeoutSeconds: 4}
`)
	alerts := g.alerts()
	for _, a := range alerts {
		if strings.Contains(a, "Certificate") || strings.Contains(a, "CA") || strings.Contains(a, "Proxy") {
			t.Errorf("alert %s rendered with cert-manager and no proxy", a)
		}
	}
	for _, want := range []string{"KvnetWebhookDown", "KvnetMigrationPoolExhausted", "KvnetConfigGenerationsDiffer"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alert %s missing: %v", want, alerts)
		}
	}
	for _, grp := range g.Groups {
		for _, r := range grp.Rules {
			if r.Labels["team"] != "network" {
				t.Errorf("alert %s: alertLabels not applied: %v", r.Alert, r.Labels)
			}
			if strings.Contains(r.Expr, "job=") && !strings.Contains(r.Expr, `job="kvnet-metrics"`) {
				t.Errorf("alert %s does not select the configured job: %s", r.Alert, r.Expr)
			}
			if strings.Contains(r.Expr, "[5m]") {
				t.Errorf("alert %s ignores rateWindow: %s", r.Alert, r.Expr)
			}
			switch r.Alert {
			case "KvnetMigrationPoolNearlyFull":
				if !strings.Contains(r.Expr, ">= 0.75") || r.For != "30m" {
					t.Errorf("%s: threshold or for not from values: %s for %s", r.Alert, r.Expr, r.For)
				}
			case "KvnetAdmissionLatencyHigh":
				if !strings.HasSuffix(strings.TrimSpace(r.Expr), "> 2") {
					t.Errorf("%s: want half of the 4s timeout: %s", r.Alert, r.Expr)
				}
			}
		}
	}
}

// The dashboard ConfigMap carries the sidecar's label and the chart's JSON
// unchanged; every panel queries something.
func TestDashboardConfigMap(t *testing.T) {
	objs := render(t, chartCase{release: "kvnet", namespace: "kvnet-system"})
	for _, o := range find(objs, "ConfigMap") {
		if strings.HasSuffix(o.GetName(), "-dashboard") {
			t.Fatalf("defaults render the dashboard ConfigMap %s", o.GetName())
		}
	}
	objs = render(t, chartCase{release: "kvnet", namespace: "kvnet-system", values: `
monitoring: {dashboard: {enabled: true, label: grafana_dashboard, labelValue: "kvnet", namespace: monitoring, annotations: {grafana_folder: KubeVirt}}}
`})
	var cm *corev1.ConfigMap
	for _, o := range find(objs, "ConfigMap") {
		if o.GetName() == "kvnet-dashboard" {
			cm = &corev1.ConfigMap{}
			decodeObj(t, o, cm)
		}
	}
	if cm == nil {
		t.Fatal("no kvnet-dashboard ConfigMap rendered")
	}
	if cm.Namespace != "monitoring" || cm.Labels["grafana_dashboard"] != "kvnet" || cm.Annotations["grafana_folder"] != "KubeVirt" {
		t.Fatalf("dashboard ConfigMap %s/%s labels %v annotations %v", cm.Namespace, cm.Name, cm.Labels, cm.Annotations)
	}
	file, err := os.ReadFile(filepath.Join(chart, "dashboards", "kvnet.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.TrimSpace([]byte(cm.Data["kvnet.json"])), bytes.TrimSpace(file)) {
		t.Fatal("the ConfigMap's kvnet.json differs from charts/kvnet/dashboards/kvnet.json")
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(file, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	panels := 0
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if !strings.Contains(q.Expr, "kvnet_") {
				t.Errorf("panel %q: query %q uses no kvnet metric", p.Title, q.Expr)
			}
		}
	}
	if dash.UID == "" || panels < 15 {
		t.Fatalf("dashboard uid %q with %d panels", dash.UID, panels)
	}
}

func decodeObj(t *testing.T, o *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
	}
}
