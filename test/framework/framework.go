// Package framework starts a real kube-apiserver and etcd (envtest) with the
// CRDs kvnet works with, runs kvnet's manager against it, and registers
// kvnet's webhooks so the API server calls them exactly as in a cluster.
//
// The binaries come from hack/control-plane.sh (KUBEBUILDER_ASSETS or
// bin/k8s/<version>). Without them the tests fail with a message saying how to
// build them; they are never silently skipped.
package framework

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/webhook"
)

// K8sVersion is the control-plane version hack/control-plane.sh builds.
const K8sVersion = "v1.37.2"

// KvnetNamespace is kvnet's own namespace in tests.
const KvnetNamespace = "kvnet-system"

// Env is a running control plane with kvnet attached.
type Env struct {
	Env    *envtest.Environment
	Config *rest.Config
	// Client talks to the API server directly (no cache), as a user would.
	Client client.Client
	// Manager is kvnet's manager, webhooks and controllers included.
	Manager manager.Manager
	// Source is the config kvnet runs with; SetConfig swaps it.
	Source *config.Source
	// KubeVirt is KubeVirt's virt-controller and virt-api, when
	// Options.KubeVirt asked for them.
	KubeVirt *KubeVirt
	// Logs records what kvnet logs in this process.
	Logs *LogRecorder
	// MetricsCA is the PEM CA that signed the certificate of kvnet's
	// metrics listener (envtest's webhook CA; the certificate names
	// 127.0.0.1 and localhost), with Options.MetricsAddr.
	MetricsCA []byte

	// nri is what StartNRI needs from start-up (Options.NRI).
	nri *nriClient

	// dir holds the run's certificates and component logs.
	dir     string
	keepDir bool

	cancel context.CancelFunc
	done   chan error
}

// RepoRoot finds the module root from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// AssetsDir locates kube-apiserver and etcd.
func AssetsDir() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		dir = filepath.Join(RepoRoot(), "bin", "k8s", K8sVersion)
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s not found in %s: run hack/control-plane.sh (make control-plane) first", b, dir)
		}
	}
	return dir, nil
}

// KubeVirtVersion is the KubeVirt release whose CRDs every test environment
// installs and whose virt-controller and virt-api the real-KubeVirt tier runs.
const KubeVirtVersion = "v1.9.0"

// KubeVirtCRDDir holds KubeVirt's own generated CRDs (see its README).
func KubeVirtCRDDir() string {
	return filepath.Join(RepoRoot(), "test", "crds", "kubevirt-"+KubeVirtVersion)
}

// CRDPaths lists the CRD files: NAD and IPAMClaim from their Go modules (the
// versions go.mod pins), and KubeVirt's real generated CRDs, so that the API
// server applies KubeVirt's schema (types, enums, CEL rules, pruning) to
// everything kvnet writes.
func CRDPaths() ([]string, error) {
	paths := []string{KubeVirtCRDDir()}
	for mod, file := range map[string]string{
		"github.com/k8snetworkplumbingwg/network-attachment-definition-client": "artifacts/networks-crd.yaml",
		"github.com/k8snetworkplumbingwg/ipamclaims":                           "artifacts/k8s.cni.cncf.io_ipamclaims.yaml",
	} {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", mod)
		cmd.Dir = RepoRoot()
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("locating module %s: %w", mod, err)
		}
		paths = append(paths, filepath.Join(strings.TrimSpace(string(out)), file))
	}
	return paths, nil
}

// Options tune Start.
type Options struct {
	// ConfigYAML is kvnet's policy; empty means defaults.
	ConfigYAML string
	// LeaderElect runs kvnet's controllers under leader election.
	LeaderElect bool
	// KubeVirt, when set, also runs KubeVirt's own virt-controller and
	// virt-api (the real-KubeVirt tier; see kubevirt.go).
	KubeVirt *KubeVirtOptions
	// MetricsAddr is where kvnet serves /metrics (host:port); empty means
	// off. kvnet serves them as in a cluster: over HTTPS (with envtest's
	// webhook serving certificate, see Env.MetricsCA) to bearer tokens the
	// API server allows get on /metrics.
	MetricsAddr string
	// NRI prepares the API server for StartNRI: a client certificate it
	// presents to network-resources-injector's webhook, which requires one.
	NRI bool
	// ConfigFile, when set, is loaded and watched by a config.Watcher run by
	// the manager, as `kvnet webhook` does; ConfigYAML is then ignored.
	ConfigFile string
}

// Start boots the control plane and kvnet. Call Stop when done.
//
// It is long on purpose: one sequence in which each block starts what the
// next needs (assets, the API server with its webhook configurations,
// kvnet's manager, KubeVirt, network-resources-injector), and on error
// stops what it started; the work of each is in its own function.
func Start(o Options) (*Env, error) {
	logs := &LogRecorder{}
	ctrl.SetLogger(recording(zap.New(zap.UseDevMode(true), zap.Level(zapLevel())), logs))
	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}
	crds, err := CRDPaths()
	if err != nil {
		return nil, err
	}
	mutating, validating := webhook.Registration{
		ServiceNamespace: KvnetNamespace, ServiceName: "kvnet", ServicePort: 443,
		ExcludedNamespaces: []string{"kube-system", KvnetNamespace},
		// Tests swap the config at run time (SetConfig), so every pod
		// webhook is registered whatever the start-up config needs.
		LauncherPods: true, MigrationPods: true,
	}.Configurations()
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: true,
		Scheme:                app.Scheme(),
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			MutatingWebhooks:   []*admissionregv1.MutatingWebhookConfiguration{mutating},
			ValidatingWebhooks: []*admissionregv1.ValidatingWebhookConfiguration{validating},
		},
	}
	dir, err := os.MkdirTemp("", "kvnet-test-")
	if err != nil {
		return nil, err
	}
	if o.KubeVirt != nil {
		if err := FrontProxy(te, filepath.Join(dir, "front-proxy")); err != nil {
			return nil, err
		}
	}
	var nri *nriClient
	if o.NRI {
		if nri, err = webhookClientCert(te, filepath.Join(dir, "webhook-clients")); err != nil {
			return nil, err
		}
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	e := &Env{Env: te, Config: cfg, dir: dir, Logs: logs, nri: nri}
	if e.Client, err = client.New(cfg, client.Options{Scheme: app.Scheme()}); err != nil {
		_ = te.Stop()
		return nil, err
	}
	ctx := context.Background()
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KvnetNamespace}}); err != nil {
		_ = te.Stop()
		return nil, err
	}
	var watcher *config.Watcher
	if o.ConfigFile != "" {
		if watcher, err = config.NewWatcher(o.ConfigFile, KvnetNamespace, ctrl.Log.WithName("config")); err != nil {
			_ = te.Stop()
			return nil, fmt.Errorf("test config: %w", err)
		}
		e.Source = &watcher.Source
	} else {
		c, err := config.Parse([]byte(o.ConfigYAML), KvnetNamespace)
		if err != nil {
			_ = te.Stop()
			return nil, fmt.Errorf("test config: %w", err)
		}
		e.Source = config.Static(c)
	}
	wio := &te.WebhookInstallOptions
	metricsAddr, metricsCertDir := "0", ""
	if o.MetricsAddr != "" {
		// The webhooks' certificate, as the chart gives kvnet's Deployment
		// (--metrics-cert-dir=--cert-dir): a scraper can verify it.
		metricsAddr, metricsCertDir, e.MetricsCA = o.MetricsAddr, wio.LocalServingCertDir, wio.LocalServingCAData
	}
	mgr, err := app.NewManager(ctx, cfg, app.ServeOptions{
		Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		MetricsAddr: metricsAddr, MetricsCertDir: metricsCertDir, ProbeAddr: "0", TLSMinVersion: "1.2",
		LeaderElect: o.LeaderElect, LeaderElectionID: "kvnet-test", Namespace: KvnetNamespace,
	}, e.Source)
	if err != nil {
		_ = te.Stop()
		return nil, err
	}
	if watcher != nil {
		if err := mgr.Add(watcher); err != nil {
			_ = te.Stop()
			return nil, err
		}
	}
	e.Manager = mgr
	runCtx, cancel := context.WithCancel(context.Background())
	e.cancel, e.done = cancel, make(chan error, 1)
	go func() { e.done <- mgr.Start(runCtx) }()
	if err := e.waitReady(30 * time.Second); err != nil {
		e.Stop()
		return nil, err
	}
	if o.KubeVirt != nil {
		if e.KubeVirt, err = StartKubeVirt(ctx, e.Config, e.Client, filepath.Join(dir, "kubevirt"), *o.KubeVirt); err != nil {
			e.keepDir = true
			e.Stop()
			return nil, fmt.Errorf("starting KubeVirt %s (logs kept in %s): %w", KubeVirtVersion, filepath.Join(dir, "kubevirt", "logs"), err)
		}
	}
	return e, nil
}

// Report prints where the run's component logs are, and their last lines,
// and keeps them after Stop: TestMain calls it when a test failed.
func (e *Env) Report(w io.Writer) {
	if e.KubeVirt == nil {
		return
	}
	e.keepDir = true
	fmt.Fprintf(w, "KubeVirt component logs are kept in %s\n%s", e.KubeVirt.LogDir, e.KubeVirt.LogTails(60))
}

// waitReady waits for the caches and the webhook listener.
func (e *Env) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if !e.Manager.GetCache().WaitForCacheSync(ctx) {
		return fmt.Errorf("kvnet's informer caches did not sync within %s", timeout)
	}
	check := e.Manager.GetWebhookServer().StartedChecker()
	for {
		if err := check(nil); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kvnet's webhook server did not start within %s", timeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// SetConfig swaps kvnet's policy; the returned func restores the previous one.
func (e *Env) SetConfig(yaml string) (restore func(), err error) {
	c, err := config.Parse([]byte(yaml), KvnetNamespace)
	if err != nil {
		return nil, err
	}
	prev := e.Source.Get()
	e.Source.Set(c)
	return func() { e.Source.Set(prev) }, nil
}

// Stop ends KubeVirt's components, kvnet and the control plane, and
// removes the run's directory unless Report asked to keep it.
func (e *Env) Stop() {
	if e.KubeVirt != nil {
		e.KubeVirt.Stop()
	}
	if e.cancel != nil {
		e.cancel()
		<-e.done
	}
	_ = e.Env.Stop()
	if !e.keepDir && os.Getenv("KVNET_TEST_KEEP") == "" {
		_ = os.RemoveAll(e.dir)
	}
}

func zapLevel() zapcore.Level {
	if os.Getenv("KVNET_TEST_DEBUG") != "" {
		return -1
	}
	return 2 // errors only: keep CI output readable
}
