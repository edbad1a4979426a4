// Package monitoring tests kvnet's alerts and dashboard against the real
// thing: kvnet on a real API server (test/framework) serving /metrics on
// loopback over HTTPS to tokens the API server authorizes, its config loaded
// from a watched file as `kvnet webhook` does, and a real Prometheus (built
// by hack/prometheus.sh) scraping it with a ServiceAccount token bound to the
// chart's metrics-reader ClusterRole and evaluating the chart's rules.
package monitoring

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
)

// The namespace the migration NAD lives in, and the one-address pool that
// the test exhausts.
const (
	nadNamespace = "mon-migration"
	goodConfig   = `
migration:
  namespace: mon-migration
  inCluster:
    nad: mon-migration/migration
    pool:
      cidr: 10.98.0.0/24
      ranges: [10.98.0.10-10.98.0.10]
`
	// A value of the wrong type: the watcher refuses the file and keeps
	// goodConfig in force.
	brokenConfig = goodConfig + "kubeOVN: {legacyLiveMigration: maybe}\n"
)

var (
	env         *framework.Env
	configFile  string
	metricsAddr string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "kvnet-monitoring")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	configFile = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configFile, []byte(goodConfig), 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if metricsAddr, err = freeAddr(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	env, err = framework.Start(framework.Options{ConfigFile: configFile, MetricsAddr: metricsAddr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration environment:", err)
		return 1
	}
	defer env.Stop()
	// The self-managed certificate path sets the expiry gauges; a 10-day
	// serving certificate is inside the alert's 14 days.
	if err := selfManagedCerts(dir); err != nil {
		fmt.Fprintln(os.Stderr, "certificates:", err)
		return 1
	}
	return m.Run()
}

func selfManagedCerts(dir string) error {
	flags := app.CertFlags{Mode: app.CertModeSelfManaged, Secret: "kvnet-monitoring-cert", ServiceName: "kvnet", CertLifetime: 240 * time.Hour}
	o, err := flags.Options(framework.KvnetNamespace, filepath.Join(dir, "certs"))
	if err != nil {
		return err
	}
	r, err := certs.New(env.Client, o, logr.Discard())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return r.EnsureReady(ctx)
}

// freeAddr picks a loopback port that is free now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// helm renders the chart; HELM overrides bin/tools/helm.
func helm(t *testing.T, values string, args ...string) []byte {
	t.Helper()
	bin := os.Getenv("HELM")
	if bin == "" {
		bin = filepath.Join(framework.RepoRoot(), "bin", "tools", "helm")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm not found at %s: run hack/helm.sh (make helm) first", bin)
	}
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	args = append(args, filepath.Join(framework.RepoRoot(), "charts", "kvnet"), "--values", f, "--kube-version", framework.K8sVersion)
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// chartRules renders the chart's PrometheusRule for release kvnet in
// kvnet's namespace and returns its spec as a Prometheus rule file.
func chartRules(t *testing.T, values string) []byte {
	t.Helper()
	out := helm(t, values, "template", "kvnet", "--namespace", framework.KvnetNamespace, "--show-only", "templates/prometheusrule.yaml")
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if u.GetKind() == "PrometheusRule" {
			spec, err := yaml.Marshal(u.Object["spec"])
			if err != nil {
				t.Fatal(err)
			}
			return spec
		}
	}
	t.Fatal("the chart rendered no PrometheusRule")
	return nil
}

// prometheus runs a real Prometheus on a loopback port that scrapes kvnet
// every two seconds (the pool gauges list allocations at scrape time, which
// a loaded machine makes slow) as job "kvnet" in kvnet's namespace (the labels a
// ServiceMonitor gives) and evaluates rules every second. It is stopped
// when the test ends.
func prometheus(t *testing.T, rules []byte) string {
	t.Helper()
	bin, err := framework.PrometheusTool("prometheus")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o600); err != nil {
		t.Fatal(err)
	}
	// What the chart's ServiceMonitor asks of prometheus-operator: HTTPS,
	// kvnet's certificate verified with its CA, and the Prometheus'
	// ServiceAccount token.
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(readerToken(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), env.MetricsCA, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`
global: {scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 1s}
rule_files: [%s]
scrape_configs:
  - job_name: kvnet
    scheme: https
    authorization: {type: Bearer, credentials_file: %s}
    tls_config: {ca_file: %s, server_name: localhost}
    static_configs:
      - targets: [%q]
        labels: {namespace: %s}
`, filepath.Join(dir, "rules.yaml"), filepath.Join(dir, "token"), filepath.Join(dir, "ca.crt"), metricsAddr, framework.KvnetNamespace)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("prometheus log:\n%s", out)
		}
	})
	base := "http://" + addr
	framework.Eventually(t, "Prometheus ready", 60*time.Second, func() error {
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/-/ready: %s", resp.Status)
		}
		return nil
	})
	return base
}

// apiGet decodes the data of a Prometheus HTTP API answer.
func apiGet(base, path string, params url.Values, out any) error {
	resp, err := http.Get(base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", path, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

type alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// firing lists the names of the alerts Prometheus has firing, with their
// pool label when they have one (KvnetMigrationPoolExhausted/in-cluster).
func firing(base string) (map[string]bool, error) {
	var data struct {
		Alerts []alert `json:"alerts"`
	}
	if err := apiGet(base, "/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, a := range data.Alerts {
		if a.State != "firing" {
			continue
		}
		name := a.Labels["alertname"]
		if p := a.Labels["pool"]; p != "" {
			name += "/" + p
		}
		out[name] = true
	}
	return out, nil
}

// dump is an instant query's result as Prometheus' JSON, for failure messages.
func dump(base, q string) string {
	var data json.RawMessage
	if err := apiGet(base, "/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return err.Error()
	}
	return string(data)
}

// query runs an instant query and returns how many series it gave.
func query(base, q string) (int, error) {
	var data struct {
		Result []json.RawMessage `json:"result"`
	}
	if err := apiGet(base, "/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return 0, err
	}
	return len(data.Result), nil
}

// The test's rules: the chart's, with every for: at 0s and a 30s window, so
// the alerts fire within seconds of the condition.
const fastRules = `
monitoring:
  prometheusRule:
    enabled: true
    rateWindow: 30s
    webhookDown: {for: 0s}
    webhookErrors: {for: 0s}
    admissionLatency: {for: 0s}
    migrationPoolNearlyFull: {for: 0s}
    migrationPoolExhausted: {for: 0s}
    claimsLeaked: {for: 0s}
    configReloadFailing: {for: 0s}
    configGenerationsDiffer: {for: 0s}
    certificateExpiry: {for: 0s}
`

// A migration pool of one address, exhausted by a second virt-handler, and a
// config file kvnet refuses: Prometheus, scraping kvnet and evaluating the
// chart's rules, shows KvnetMigrationPoolExhausted, KvnetMigrationPoolNearlyFull
// and KvnetConfigReloadFailing firing (and the 10-day serving certificate's
// KvnetServingCertificateExpiringSoon), where before none of the first three
// did.
func TestAlertsFireOnRealPrometheus(t *testing.T) {
	base := prometheus(t, chartRules(t, fastRules))
	ctx := context.Background()

	// Scraped, with the exhaustion counter seen at 0 (the first denial must
	// be an increase), the pool's size known and the config accepted.
	framework.Eventually(t, "kvnet scraped by Prometheus", 60*time.Second, func() error {
		for _, q := range []string{
			`up{job="kvnet"} == 1`,
			`kvnet_migration_denials_total{job="kvnet", pool="in-cluster", reason="exhausted"} == 0`,
			`kvnet_migration_pool_size{job="kvnet", pool="in-cluster"} == 1`,
			`kvnet_config_last_reload_successful{job="kvnet"} == 1`,
		} {
			if n, err := query(base, q); err != nil || n == 0 {
				return fmt.Errorf("%s: %d series, %v", q, n, err)
			}
		}
		// Evaluated before the first scrape, KvnetWebhookDown fired; it
		// resolves at the next evaluation.
		if got, err := firing(base); err != nil || got["KvnetWebhookDown"] {
			return fmt.Errorf("KvnetWebhookDown still firing (%v)", err)
		}
		return nil
	})
	before, err := firing(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"KvnetMigrationPoolExhausted/in-cluster", "KvnetMigrationPoolNearlyFull/in-cluster", "KvnetConfigReloadFailing", "KvnetWebhookDown"} {
		if before[a] {
			t.Fatalf("%s fires before the test broke anything: %v", a, before)
		}
	}

	// The pool's only address goes to the first node's virt-handler; the
	// second node's is denied.
	ds := migrationSetup(t)
	if err := env.Client.Create(ctx, framework.DaemonSetPod(ds, "mon-node-1")); err != nil {
		t.Fatalf("first virt-handler: %v", err)
	}
	err = env.Client.Create(ctx, framework.DaemonSetPod(ds, "mon-node-2"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exhausted") {
		t.Fatalf("second virt-handler on a one-address pool: err = %v, want the exhaustion denial", err)
	}

	// A config file kvnet refuses.
	writeConfig(t, brokenConfig)
	t.Cleanup(func() { writeConfig(t, goodConfig) })

	want := []string{
		"KvnetMigrationPoolExhausted/in-cluster",
		"KvnetMigrationPoolNearlyFull/in-cluster",
		"KvnetConfigReloadFailing",
		"KvnetServingCertificateExpiringSoon",
	}
	framework.Eventually(t, "alerts firing", 90*time.Second, func() error {
		got, err := firing(base)
		if err != nil {
			return err
		}
		var missing []string
		for _, a := range want {
			if !got[a] {
				missing = append(missing, a)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not firing: %v (firing: %v); Prometheus has %s", missing, got, dump(base,
				`{__name__=~"kvnet_migration_denials_total|kvnet_migration_pool_used|kvnet_migration_pool_size", pool="in-cluster"}`))
		}
		return nil
	})
	// The refused file changed nothing: the pool is still the one-address one.
	if got := env.Source.Get().Migration.InCluster; got == nil || got.Pool.CIDR != "10.98.0.0/24" {
		t.Fatalf("the refused config replaced the one in force: %+v", got)
	}

	// A good file again: the reload alert resolves, the pool ones stay.
	writeConfig(t, goodConfig+"# fixed\n")
	framework.Eventually(t, "KvnetConfigReloadFailing resolved", 90*time.Second, func() error {
		got, err := firing(base)
		if err != nil {
			return err
		}
		if got["KvnetConfigReloadFailing"] || !got["KvnetMigrationPoolNearlyFull/in-cluster"] {
			return fmt.Errorf("firing: %v", got)
		}
		return nil
	})
}

// writeConfig replaces the config file in one rename, as kubelet swaps a
// ConfigMap volume: the watcher must never see a half-written file (an
// empty file is a valid, empty config).
func writeConfig(t *testing.T, content string) {
	t.Helper()
	tmp := configFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, configFile); err != nil {
		t.Fatal(err)
	}
}

// migrationSetup creates the migration NAD, two nodes and virt-handler's
// DaemonSet as virt-operator would.
func migrationSetup(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nadNamespace}},
		&nadv1.NetworkAttachmentDefinition{
			ObjectMeta: metav1.ObjectMeta{Namespace: nadNamespace, Name: "migration"},
			Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.4.0","name":"migration","type":"bridge","bridge":"br-mig"}`},
		},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mon-node-1"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "mon-node-2"}},
	} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
	framework.Eventually(t, "NAD in kvnet's cache", 30*time.Second, func() error {
		return env.Manager.GetCache().Get(ctx, client.ObjectKey{Namespace: nadNamespace, Name: "migration"}, &nadv1.NetworkAttachmentDefinition{})
	})
	labels := map[string]string{"kubevirt.io": "virt-handler"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: nadNamespace, Name: "virt-handler", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{multus.NetworksAnnotation: "migration@migration0"}},
				Spec: corev1.PodSpec{
					ServiceAccountName: "kubevirt-handler",
					Containers:         []corev1.Container{{Name: "virt-handler", Image: "quay.io/kubevirt/virt-handler:v1.6.0"}},
				},
			},
		},
	}
	if err := env.Client.Create(ctx, ds); err != nil {
		t.Fatalf("creating DaemonSet: %v", err)
	}
	return ds
}

// metricName matches kvnet's metric names in PromQL. A regexp rather than
// Prometheus' PromQL parser: that parser is only in the prometheus/prometheus
// module, far too heavy a dependency for a test, and every kvnet metric
// starts with kvnet_.
var metricName = regexp.MustCompile(`\bkvnet_[a-z0-9_]+`)

// Every metric the chart's rules (all groups rendered) and its dashboard
// query is in kvnet's own /metrics output, after one admitted pod.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	used := map[string]string{}
	rules := chartRules(t, "monitoring: {prometheusRule: {enabled: true}}\nmigrationProxy: {enabled: true, sidecar: {enabled: false}, allowedSources: [10.200.0.0/24]}\n")
	for _, m := range metricName.FindAllString(string(rules), -1) {
		used[m] = "rules"
	}
	dash, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "charts", "kvnet", "dashboards", "kvnet.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			used[m] = "dashboard"
		}
	}
	if len(used) < 25 {
		t.Fatalf("only %d metric names found in the rules and the dashboard: %v", len(used), used)
	}

	// One admission request, so the request and step series exist.
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "mon-names"}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, GenerateName: "virt-launcher-", Labels: map[string]string{"kubevirt.io": "virt-launcher"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.6.0"}}},
	}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatalf("launcher pod: %v", err)
	}

	code, body, err := framework.Scrape(metricsAddr, metricsTLS(t), readerToken(t))
	if err != nil || code != http.StatusOK {
		t.Fatalf("scraping kvnet as a metrics reader: %d, %v: %s", code, err, body)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("kvnet's /metrics: %v", err)
	}
	exported := map[string]bool{}
	for name, f := range families {
		if len(f.GetMetric()) == 0 {
			continue
		}
		exported[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				exported[name+s] = true
			}
		}
	}
	var missing []string
	for m, where := range used {
		if !exported[m] && !declaredPerPeer(t, m) {
			missing = append(missing, m+" ("+where+")")
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		var have []string
		for m := range exported {
			if strings.HasPrefix(m, "kvnet_") {
				have = append(have, m)
			}
		}
		slices.Sort(have)
		t.Fatalf("used but not in kvnet's /metrics: %v\nkvnet exports: %v", missing, have)
	}
	ctrl.Log.Info("metrics checked", "names", len(used))
}

// perPeer are the metrics that have a series only per peer cluster, and
// where each is declared: kvnet proxy's CA exchange, once it runs for a
// configured peer (TestProxyKubeVirtCASync checks they are set), and the
// claim controller's leases, once a moved VM's claims are kept
// (TestMovedVMKeepsItsClaimsAsLeases checks them). The webhook process
// scraped here has neither, so no series. For them the check is that a Go
// file under that folder declares the exact name, which still catches a
// rule with a misspelt one.
var perPeer = map[string]string{
	"kvnet_proxy_ca_exchange_last_success_timestamp_seconds": "internal/proxy",
	"kvnet_persistentips_oldest_lease_age_seconds":           "internal/persistentips",
	"kvnet_persistentips_leases_held":                        "internal/persistentips",
}

func declaredPerPeer(t *testing.T, name string) bool {
	t.Helper()
	dir, ok := perPeer[name]
	if !ok {
		return false
	}
	// Packages are split by job (the proxy's CA exchange declares its
	// metric in a package of its own): every Go file under dir is read.
	var files []string
	err := filepath.WalkDir(filepath.Join(framework.RepoRoot(), dir), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no Go files under %s: the package moved, update this check", dir)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), `"`+name+`"`) {
			return true
		}
	}
	return false
}
