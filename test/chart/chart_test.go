// Package chart tests charts/kvnet: helm lint and template over a matrix of
// values, every rendered object created on a real kube-apiserver with strict
// field validation (so a typo in any field fails), the webhook
// configurations identical to webhook/registration.go, and the API server
// itself showing which pods it sends to kvnet.
package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

var (
	cl      client.Client
	testEnv *envtest.Environment
	helmBin string
	chart   = filepath.Join(framework.RepoRoot(), "charts", "kvnet")
)

// kubeVersion is what helm templates for; without it helm assumes the
// version it was built against, which `go install` leaves at v1.20.
const kubeVersion = framework.K8sVersion

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	helmBin = os.Getenv("HELM")
	if helmBin == "" {
		helmBin = filepath.Join(framework.RepoRoot(), "bin", "tools", "helm")
	}
	if _, err := os.Stat(helmBin); err != nil {
		fmt.Fprintf(os.Stderr, "helm not found at %s: run hack/helm.sh (make helm) first\n", helmBin)
		return 1
	}
	assets, err := framework.AssetsDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	crds, err := framework.CRDPaths()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     append(crds, filepath.Join(framework.RepoRoot(), "test", "chart", "crds")),
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := te.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting kube-apiserver and etcd:", err)
		return 1
	}
	defer func() { _ = te.Stop() }()
	testEnv = te
	if cl, err = client.New(cfg, client.Options{Scheme: app.Scheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// A case of the values matrix: a release name, a namespace and values.
type chartCase struct {
	release, namespace string
	values             string
}

// matrix covers both certificate modes, a user issuer, the optional
// objects on and off, migration networks on and off, and renamed releases.
var matrix = map[string]chartCase{
	"defaults (self-managed)": {release: "kvnet", namespace: "kvnet-system"},
	"cert-manager self-signed with ServiceMonitor": {release: "kvnet", namespace: "kvnet-cm", values: `
certs: {mode: cert-manager}
metrics: {serviceMonitor: {enabled: true, labels: {release: prometheus}}}
`},
	"cert-manager with a ClusterIssuer, single replica, optional objects off": {release: "edge", namespace: "edge-system", values: `
replicaCount: 1
leaderElection: {enabled: false}
podDisruptionBudget: {enabled: false}
networkPolicy: {enabled: false}
serviceAccount: {create: false, name: default}
certs:
  mode: cert-manager
  secretName: edge-tls
  certManager: {issuerRef: {name: corp-ca, kind: ClusterIssuer}, duration: 2160h, renewBefore: 360h}
`},
	"self-managed short lifetimes, policy and migration networks on": {release: "prod", namespace: "prod-net", values: `
fullnameOverride: kvnet-prod
logLevel: debug
tlsMinVersion: "1.3"
extraArgs: [--zap-devel]
webhooks: {failurePolicy: Ignore, timeoutSeconds: 5, reinvocationPolicy: Never, labels: {team: net}}
networkPolicy:
  webhookFrom: [{ipBlock: {cidr: 10.0.0.0/24}}]
certs:
  selfManaged: {caLifetime: 8760h, certLifetime: 720h, renewBefore: 240h, caRenewBefore: 2160h, checkInterval: 30s}
topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app.kubernetes.io/name: kvnet}}}
config:
  excludedNamespaces: [kube-system, openshift-monitoring]
  networkRules:
    - name: storage
      namespaceSelector: {matchLabels: {kvnet.io/storage-network: "true"}}
      networks: [{name: storage, nad: storage}]
  vdpa: {resourcePrefixes: ["jaguarmicro.com/"], bindingPlugin: vdpa}
  kubeOVN: {legacyLiveMigration: true}
  persistentIPs: {enabled: true}
  migration:
    inCluster:
      nad: kubevirt/migration
      pool: {cidr: 10.10.0.0/24}
`},
	"alerts and dashboard on, migration proxy on": {release: "kvnet", namespace: "kvnet-mon", values: `
migrationProxy: {enabled: true, sidecar: {enabled: false}, allowedSources: [10.200.0.0/24]}
metrics:
  serviceMonitor: {enabled: true, bearerTokenSecret: {name: prometheus-token, key: token}, tlsConfig: {insecureSkipVerify: true}}
  reader: {subjects: [{kind: ServiceAccount, name: prometheus-k8s, namespace: monitoring}]}
monitoring:
  prometheusRule: {enabled: true, labels: {release: prometheus}, alertLabels: {team: network}}
  dashboard: {enabled: true, annotations: {grafana_folder: kvnet}}
`},
	// Nothing needs a pod webhook: none is registered, so a kvnet outage
	// cannot stop a single pod.
	"persistent IPs off, no resources, no kube-ovn, no migration network": {release: "vmonly", namespace: "vmonly-system", values: `
config:
  persistentIPs: {enabled: false}
  resources: {inject: never}
`},
	"migration proxy as a separate Deployment": {release: "kvnet", namespace: "kvnet-proxy", values: `
migrationProxy: {enabled: true, sidecar: {enabled: false}, replicas: 2, dialTimeout: 5s, allowedSources: [10.200.0.0/24, "fd00:200::/64"]}
`},
	"migration proxy as a separate Deployment with a fixed address": {release: "xc", namespace: "xc-system", values: `
migrationProxy: {enabled: true, sidecar: {enabled: false}, replicas: 1, advertiseAddress: 192.0.2.10, allowedSources: [192.0.2.0/24]}
`},
	"migration proxy in sidecar mode (the default) with peers": {release: "kvnet", namespace: "kvnet-sidecar", values: sidecarValues},
}

// sidecarValues is sidecar mode with a peer, KubeVirt in namespace
// kv-sidecar (where the peers ConfigMap goes).
const sidecarValues = `
migrationProxy:
  enabled: true
  sidecar: {namespace: kv-sidecar}
  certSecret: proxy-cert
  allowedSources: [10.10.0.0/24]
  peers: [{name: east, addresses: ["10.20.1.10:9444", "10.20.1.11:9444"], caBundle: "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"}]
config:
  migration:
    inCluster: {nad: kv-sidecar/migration, pool: {cidr: 10.10.0.0/24}}
    crossCluster: {nad: kv-sidecar/crosscluster, addresses: [10.20.0.10/24, 10.20.0.11/24, 10.20.0.12/24]}
`

// Every case lints, renders, carries a config kvnet accepts, and every
// object it renders is created by the real API server with strict field
// validation.
func TestChartMatrixInstallsOnAPIServer(t *testing.T) {
	for name, c := range matrix {
		t.Run(name, func(t *testing.T) {
			objs := render(t, c)
			checkConfig(t, c, objs)
			install(t, c, objs)
		})
	}
}

// Values the schema must refuse, each with the words helm must say.
func TestChartRefusesBadValues(t *testing.T) {
	for values, want := range map[string]string{
		"certs: {mode: vault}":                         "/certs/mode",
		"webhooks: {timeoutSeconds: 60}":               "/webhooks/timeoutSeconds",
		"webhooks: {failurePolicy: fail}":              "/webhooks/failurePolicy",
		"replicas: 3":                                  "replicas",
		"certs: {selfManaged: {caLifetime: 1y}}":       "/certs/selfManaged/caLifetime",
		"config: {excludedNamespaces: kube-system}":    "/config/excludedNamespaces",
		"migrationProxy: {sidecar: {namespace: \"\"}}": "/migrationProxy/sidecar/namespace",
		// Not a schema error: the template refuses sidecar mode without
		// the migration networks it runs on.
		"migrationProxy: {enabled: true}": "migrationProxy.sidecar.enabled",
		// A proxy Deployment with no pool to default its sources to: it
		// would accept any client, so the chart refuses to render it.
		"migrationProxy: {enabled: true, certSecret: c, sidecar: {enabled: false}}": "migrationProxy.allowedSources",
	} {
		t.Run(values, func(t *testing.T) {
			_, err := helm(t, values, "template", "kvnet", chart, "--kube-version", kubeVersion)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("helm template with %q: err = %v, want a schema error naming %s", values, err, want)
			}
		})
	}
}

// The rendered webhook configurations are exactly what
// webhook.Registration builds for the same service and knobs: the chart
// and kvnet's code cannot drift apart.
func TestChartWebhooksMirrorRegistration(t *testing.T) {
	for name, c := range matrix {
		t.Run(name, func(t *testing.T) {
			objs := render(t, c)
			vals := values(t, c)
			fullname := c.release
			if c.release != "kvnet" && !strings.Contains(c.release, "kvnet") {
				fullname = c.release + "-kvnet"
			}
			if f, ok := vals["fullnameOverride"].(string); ok {
				fullname = f
			}
			reg := webhook.Registration{
				Name: fullname, ServiceNamespace: c.namespace, ServiceName: fullname, ServicePort: 443,
				ExcludedNamespaces: append(excludedFromValues(vals), c.namespace),
			}
			// The registration follows the config the chart renders (with
			// the migration holders it adds), not the config value alone.
			var cm corev1.ConfigMap
			decodeKind(t, objs, "ConfigMap", &cm)
			rendered, err := config.Parse([]byte(cm.Data["config.yaml"]), c.namespace)
			if err != nil {
				t.Fatalf("rendered config: %v", err)
			}
			reg = reg.For(rendered)
			if p, ok := vals["migrationProxy"].(map[string]any); ok && p["enabled"] == true {
				reg.MigrationProxy = true
			}
			if w, ok := vals["webhooks"].(map[string]any); ok {
				if fp, ok := w["failurePolicy"].(string); ok {
					reg.FailurePolicy = admissionregv1.FailurePolicyType(fp)
				}
				if ts, ok := w["timeoutSeconds"].(float64); ok {
					reg.TimeoutSeconds = int32(ts)
				}
			}
			wantM, wantV := reg.Configurations()
			if w, ok := vals["webhooks"].(map[string]any); ok && w["reinvocationPolicy"] != nil {
				p := admissionregv1.ReinvocationPolicyType(w["reinvocationPolicy"].(string))
				for i := range wantM.Webhooks {
					if wantM.Webhooks[i].ReinvocationPolicy != nil {
						wantM.Webhooks[i].ReinvocationPolicy = &p
					}
				}
			}
			var gotM admissionregv1.MutatingWebhookConfiguration
			var gotV admissionregv1.ValidatingWebhookConfiguration
			decodeKind(t, objs, "MutatingWebhookConfiguration", &gotM)
			decodeKind(t, objs, "ValidatingWebhookConfiguration", &gotV)
			if gotM.Name != wantM.Name || gotV.Name != wantV.Name {
				t.Fatalf("configuration names %q/%q, want %q", gotM.Name, gotV.Name, wantM.Name)
			}
			if !equality.Semantic.DeepEqual(gotM.Webhooks, wantM.Webhooks) {
				t.Errorf("mutating webhooks differ from webhook.Registration:\nchart:\n%s\nregistration:\n%s", toYAML(gotM.Webhooks), toYAML(wantM.Webhooks))
			}
			if !equality.Semantic.DeepEqual(gotV.Webhooks, wantV.Webhooks) {
				t.Errorf("validating webhooks differ from webhook.Registration:\nchart:\n%s\nregistration:\n%s", toYAML(gotV.Webhooks), toYAML(wantV.Webhooks))
			}
			_, injects := gotM.Annotations["cert-manager.io/inject-ca-from"]
			if cm := strings.Contains(c.values, "mode: cert-manager"); injects != cm {
				t.Errorf("inject-ca-from annotation present = %v, want %v", injects, cm)
			}
		})
	}
}

// render runs helm lint and helm template for a case and returns the objects.
func render(t *testing.T, c chartCase) []*unstructured.Unstructured {
	t.Helper()
	if out, err := helm(t, c.values, "lint", chart, "--strict", "--namespace", c.namespace, "--kube-version", kubeVersion); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	out, err := helm(t, c.values, "template", c.release, chart, "--namespace", c.namespace, "--kube-version", kubeVersion)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatalf("helm template output: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	if len(objs) == 0 {
		t.Fatal("helm template rendered nothing")
	}
	return objs
}

// helm runs the helm binary with values (YAML, may be empty) as a values file.
func helm(t *testing.T, values string, args ...string) ([]byte, error) {
	t.Helper()
	if values != "" {
		// Not t.TempDir(): helm splits --values on commas, and subtest
		// names (hence their temp dirs) may contain them.
		tmp, err := os.MkdirTemp("", "kvnet-chart")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(tmp) })
		f := filepath.Join(tmp, "values.yaml")
		if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", f)
	}
	cmd := exec.Command(helmBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w: %s%s", strings.Join(args, " "), err, stderr.String(), out)
	}
	return out, nil
}

// checkConfig parses the rendered config.yaml as kvnet would at start-up.
func checkConfig(t *testing.T, c chartCase, objs []*unstructured.Unstructured) {
	t.Helper()
	var cm corev1.ConfigMap
	decodeKind(t, objs, "ConfigMap", &cm)
	if _, err := config.Parse([]byte(cm.Data["config.yaml"]), c.namespace); err != nil {
		t.Fatalf("kvnet refuses the rendered config: %v\n%s", err, cm.Data["config.yaml"])
	}
}

// install creates every object for real (strict field validation: unknown
// or misspelt fields are errors) in a fresh namespace, then removes the
// cluster-scoped ones so the next case and test start clean.
func install(t *testing.T, c chartCase, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{}
	ns.Name = c.namespace
	if err := cl.Create(ctx, ns); err != nil {
		t.Fatalf("namespace: %v", err)
	}
	t.Cleanup(func() { _ = cl.Delete(ctx, ns) })
	// Sidecar mode renders the proxy's peers into KubeVirt's namespace.
	for _, o := range objs {
		if n := o.GetNamespace(); n != "" && n != c.namespace {
			other := &corev1.Namespace{}
			other.Name = n
			if err := cl.Create(ctx, other); err == nil {
				t.Cleanup(func() { _ = cl.Delete(ctx, other) })
			}
		}
	}
	for _, o := range objs {
		if err := cl.Create(ctx, o, client.FieldValidation("Strict")); err != nil {
			t.Errorf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
			continue
		}
		if o.GetNamespace() == "" {
			t.Cleanup(func() { _ = cl.Delete(ctx, o) })
		}
	}
}

func values(t *testing.T, c chartCase) map[string]any {
	t.Helper()
	v := map[string]any{}
	if err := yaml.Unmarshal([]byte(c.values), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func excludedFromValues(v map[string]any) []string {
	cfg, _ := v["config"].(map[string]any)
	list, ok := cfg["excludedNamespaces"].([]any)
	if !ok {
		return []string{"kube-system"} // values.yaml's default
	}
	var out []string
	for _, n := range list {
		out = append(out, n.(string))
	}
	return out
}

// decodeKind decodes kvnet's own object of a kind: the migration proxy's
// objects (label app.kubernetes.io/component=migration-proxy, or a name
// ending in -migration-proxy) are of the same kinds and are skipped.
func decodeKind(t *testing.T, objs []*unstructured.Unstructured, kind string, out any) {
	t.Helper()
	for _, o := range objs {
		if o.GetLabels()["app.kubernetes.io/component"] == "migration-proxy" || strings.HasSuffix(o.GetName(), "-migration-proxy") {
			continue
		}
		if o.GetKind() == kind {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
				t.Fatalf("%s %s: %v", kind, o.GetName(), err)
			}
			return
		}
	}
	t.Fatalf("no %s rendered", kind)
}

func toYAML(v any) string {
	b, _ := yaml.Marshal(v)
	return string(b)
}

// The rendered configurations, registered on the real API server against a
// recording webhook, decide which objects reach kvnet: pods only with
// KubeVirt's labels, and nothing at all from kube-system or kvnet's own
// namespace.
func TestChartWebhooksNeverSelectForeignPods(t *testing.T) {
	ctx := context.Background()
	// A migration network, so that every pod webhook is registered.
	c := chartCase{release: "sel", namespace: "kvnet-sel", values: `
config:
  migration:
    inCluster: {nad: kubevirt/migration, pool: {cidr: 10.10.0.0/24}}
`}
	objs := render(t, c)
	rec := newRecorder(t)
	for _, o := range objs {
		kind := o.GetKind()
		if kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
			continue
		}
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for i := range hooks {
			h := hooks[i].(map[string]any)
			cc := h["clientConfig"].(map[string]any)
			path := cc["service"].(map[string]any)["path"].(string)
			h["clientConfig"] = map[string]any{"url": rec.url + path, "caBundle": rec.caBundle}
		}
		if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
			t.Fatal(err)
		}
		if err := cl.Create(ctx, o, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("registering %s: %v", kind, err)
		}
		t.Cleanup(func() { _ = cl.Delete(ctx, o) })
	}
	for _, n := range []string{"apps", "kubevirt", c.namespace} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
		if err := cl.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Delete(ctx, ns) })
	}
	pods := []struct {
		namespace string
		labels    map[string]string
		wantPath  string // "" = must never reach kvnet
	}{
		{"apps", nil, ""},
		{"apps", map[string]string{"app": "virt-launcher"}, ""},
		{"apps", map[string]string{"kubevirt.io": "virt-api"}, ""},
		// A tenant's look-alikes of KubeVirt's migration pods.
		{"apps", map[string]string{"kubevirt.io": "virt-handler"}, ""},
		{"apps", map[string]string{"kubevirt.io": "virt-synchronization-controller"}, ""},
		{"apps", map[string]string{"kubevirt.io": "kvnet-migration-proxy"}, ""},
		{"kube-system", map[string]string{"kubevirt.io": "virt-launcher"}, ""},
		{"kube-system", map[string]string{"kubevirt.io": "virt-handler"}, ""},
		{c.namespace, map[string]string{"kubevirt.io": "virt-launcher"}, ""},
		{c.namespace, nil, ""},
		{"apps", map[string]string{"kubevirt.io": "virt-launcher"}, webhook.PathMutateLauncherPods},
		{"kubevirt", map[string]string{"kubevirt.io": "virt-handler"}, webhook.PathMutateMigrationPods},
		{"kubevirt", map[string]string{"kubevirt.io": "virt-synchronization-controller"}, webhook.PathMutateMigrationPods},
	}
	for i, p := range pods {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.namespace, Name: fmt.Sprintf("pod-%d", i), Labels: p.labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
		}
		rec.reset()
		if err := cl.Create(ctx, pod, client.DryRunAll); err != nil {
			t.Fatalf("pod %d in %s with %v: %v", i, p.namespace, p.labels, err)
		}
		got := rec.paths()
		switch {
		case p.wantPath == "" && len(got) > 0:
			t.Errorf("pod in %s with labels %v was sent to kvnet (%v)", p.namespace, p.labels, got)
		case p.wantPath != "" && (len(got) != 1 || got[0] != p.wantPath):
			t.Errorf("pod in %s with labels %v reached %v, want exactly %s", p.namespace, p.labels, got, p.wantPath)
		}
	}
}

// The names that tie the objects together agree in every case: the Secret
// the pod mounts or kvnet writes, the Certificate the CA is injected from,
// the Service the certificate is for, the configurations kvnet injects into.
func TestChartCertificateWiringAgrees(t *testing.T) {
	for name, c := range matrix {
		t.Run(name, func(t *testing.T) {
			objs := render(t, c)
			var dep appsv1.Deployment
			var svc corev1.Service
			var mwc admissionregv1.MutatingWebhookConfiguration
			var vwc admissionregv1.ValidatingWebhookConfiguration
			decodeKind(t, objs, "Deployment", &dep)
			decodeKind(t, objs, "Service", &svc)
			decodeKind(t, objs, "MutatingWebhookConfiguration", &mwc)
			decodeKind(t, objs, "ValidatingWebhookConfiguration", &vwc)
			for _, w := range mwc.Webhooks {
				if s := w.ClientConfig.Service; s == nil || s.Name != svc.Name || s.Namespace != c.namespace || *s.Port != svc.Spec.Ports[0].Port {
					t.Errorf("webhook %s calls %+v, not the Service %s/%s:%d", w.Name, s, c.namespace, svc.Name, svc.Spec.Ports[0].Port)
				}
			}
			args := map[string]string{}
			for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
				if k, v, ok := strings.Cut(a, "="); ok {
					args[k] = v
				}
			}
			var certsVolume *corev1.Volume
			for i, v := range dep.Spec.Template.Spec.Volumes {
				if v.Name == "certs" {
					certsVolume = &dep.Spec.Template.Spec.Volumes[i]
				}
			}
			if certsVolume == nil {
				t.Fatal("no certs volume")
			}
			if strings.Contains(c.values, "mode: cert-manager") {
				var cert unstructured.Unstructured
				for _, o := range objs {
					if o.GetKind() == "Certificate" {
						cert = *o
					}
				}
				secretName, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
				if certsVolume.Secret == nil || certsVolume.Secret.SecretName != secretName {
					t.Errorf("pod mounts %+v, the Certificate writes Secret %q", certsVolume.VolumeSource, secretName)
				}
				want := c.namespace + "/" + cert.GetName()
				if mwc.Annotations["cert-manager.io/inject-ca-from"] != want || vwc.Annotations["cert-manager.io/inject-ca-from"] != want {
					t.Errorf("inject-ca-from %q/%q, want %q", mwc.Annotations["cert-manager.io/inject-ca-from"], vwc.Annotations["cert-manager.io/inject-ca-from"], want)
				}
				dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
				if !slices.Contains(dns, svc.Name+"."+c.namespace+".svc") {
					t.Errorf("Certificate names %v lack the Service's %s.%s.svc", dns, svc.Name, c.namespace)
				}
				if args["--cert-mode"] != "external" {
					t.Errorf("--cert-mode=%s, want external", args["--cert-mode"])
				}
				return
			}
			if certsVolume.EmptyDir == nil {
				t.Errorf("self-managed: the cert dir must be an emptyDir kvnet writes, got %+v", certsVolume.VolumeSource)
			}
			if args["--cert-mode"] != "self-managed" || args["--cert-service-name"] != svc.Name || args["--webhook-config-name"] != mwc.Name || mwc.Name != vwc.Name {
				t.Errorf("self-managed args %v do not name the Service %s and configurations %s/%s", args, svc.Name, mwc.Name, vwc.Name)
			}
			var role rbacv1.Role
			decodeKind(t, objs, "Role", &role)
			found := false
			for _, r := range role.Rules {
				if slices.Contains(r.Resources, "secrets") && slices.Contains(r.ResourceNames, args["--cert-secret"]) {
					found = true
				}
			}
			if !found {
				t.Errorf("the Role does not let kvnet update its Secret %q", args["--cert-secret"])
			}
		})
	}
}

// The sidecar kvnet's webhook injects runs the proxy exactly as the
// separate Deployment does (same image, flags, mounts, resources), except
// that it names kvnet's namespace (its pod runs in KubeVirt's) and always
// takes its relay address from its own pod's migration0: the two flag lists
// in the chart cannot drift apart.
func TestChartSidecarRunsTheDeploymentsProxy(t *testing.T) {
	sidecar := chartCase{release: "kvnet", namespace: "kvnet-drift", values: sidecarValues}
	separate := chartCase{release: "kvnet", namespace: "kvnet-drift",
		values: strings.Replace(sidecarValues, "sidecar: {namespace: kv-sidecar}", "sidecar: {enabled: false, namespace: kv-sidecar}", 1)}

	var cm corev1.ConfigMap
	decodeKind(t, render(t, sidecar), "ConfigMap", &cm)
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]), sidecar.namespace)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Migration.ProxySidecar.Container
	var dep *appsv1.Deployment
	for _, o := range render(t, separate) {
		if o.GetKind() == "Deployment" && strings.HasSuffix(o.GetName(), "-migration-proxy") {
			dep = &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, dep); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dep == nil {
		t.Fatal("sidecar.enabled false rendered no proxy Deployment")
	}
	want := dep.Spec.Template.Spec.Containers[0]
	wantArgs := slices.Clone(want.Args)
	for i, a := range wantArgs {
		if a == "--namespace=$(POD_NAMESPACE)" {
			wantArgs[i] = "--namespace=" + sidecar.namespace
		}
	}
	if !slices.Equal(got.Args, wantArgs) {
		t.Errorf("sidecar args differ from the Deployment's:\nsidecar:    %v\ndeployment: %v", got.Args, wantArgs)
	}
	if !slices.Contains(got.Args, "--advertise-interface=migration0") || !slices.Contains(got.Args, "--leader-election-id=kvnet-migration-proxy") {
		t.Errorf("the sidecar does not listen on its pod's migration0 under the proxy's Lease: %v", got.Args)
	}
	mounts := func(c corev1.Container) []string {
		var out []string
		for _, m := range c.VolumeMounts {
			out = append(out, m.MountPath)
		}
		return out
	}
	if got.Image != want.Image || !slices.Equal(mounts(got), mounts(want)) || !equality.Semantic.DeepEqual(got.Resources, want.Resources) {
		t.Errorf("sidecar %s %v %v, Deployment %s %v %v", got.Image, mounts(got), got.Resources, want.Image, mounts(want), want.Resources)
	}
}

// The proxy's source listeners accept only the virt-handlers by default:
// without migrationProxy.allowedSources the chart passes the in-cluster
// pool's CIDR, in sidecar mode and as a Deployment alike; an explicit list
// wins.
func TestChartProxyAllowedSourcesDefaultToThePool(t *testing.T) {
	const noList = `
migrationProxy: {enabled: true, sidecar: {namespace: kv-src}, certSecret: proxy-cert}
config:
  migration:
    inCluster: {nad: kv-src/migration, pool: {cidr: 10.30.0.0/24}}
    crossCluster: {nad: kv-src/crosscluster, addresses: [10.31.0.10/24, 10.31.0.11/24]}
`
	proxyArgs := func(values string) []string {
		t.Helper()
		objs := render(t, chartCase{release: "kvnet", namespace: "kvnet-src", values: values})
		for _, o := range objs {
			if o.GetKind() == "Deployment" && strings.HasSuffix(o.GetName(), "-migration-proxy") {
				var dep appsv1.Deployment
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &dep); err != nil {
					t.Fatal(err)
				}
				return dep.Spec.Template.Spec.Containers[0].Args
			}
		}
		var cm corev1.ConfigMap
		decodeKind(t, objs, "ConfigMap", &cm)
		cfg, err := config.Parse([]byte(cm.Data["config.yaml"]), "kvnet-src")
		if err != nil {
			t.Fatal(err)
		}
		return cfg.Migration.ProxySidecar.Container.Args
	}
	sources := func(args []string) []string {
		var out []string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--allowed-sources="); ok {
				out = append(out, v)
			}
		}
		return out
	}
	for name, tc := range map[string]struct {
		values string
		want   []string
	}{
		"sidecar, no list":    {noList, []string{"10.30.0.0/24"}},
		"deployment, no list": {strings.Replace(noList, "sidecar: {namespace: kv-src}", "sidecar: {enabled: false, namespace: kv-src}", 1), []string{"10.30.0.0/24"}},
		"explicit list":       {strings.Replace(noList, "certSecret: proxy-cert}", "certSecret: proxy-cert, allowedSources: [10.30.0.0/28, 10.32.0.0/24]}", 1), []string{"10.30.0.0/28", "10.32.0.0/24"}},
	} {
		if got := sources(proxyArgs(tc.values)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: --allowed-sources %v, want %v", name, got, tc.want)
		}
	}
}
