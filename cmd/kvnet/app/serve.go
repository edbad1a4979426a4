package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/peerwebhook"
	"github.com/kvnet/kvnet/internal/version"
	"github.com/kvnet/kvnet/webhook"
)

// ServeOptions are the webhook server's process settings. Policy lives in
// the config file; these are about where and how to listen.
type ServeOptions struct {
	ConfigPath string
	CertDir    string
	Port       int
	Host       string
	// MetricsAddr, MetricsInsecure and MetricsCertDir are where and how
	// /metrics is served (MetricsServing); the zero values of the last two
	// are HTTPS with the API server's authentication and authorization.
	MetricsAddr     string
	MetricsInsecure bool
	MetricsCertDir  string
	ProbeAddr       string
	// PprofAddr serves Go's profiles (/debug/pprof/) on a loopback
	// address, for an operator's kubectl port-forward; empty is off.
	PprofAddr        string
	TLSMinVersion    string
	LeaderElect      bool
	Namespace        string
	LeaderElectionID string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election;
	// zero keeps controller-runtime's defaults (15s, 10s, 2s). Tests shorten
	// them to hand the lease over quickly.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// SeveralManagers lets tests run more than one manager in one process
	// (replicas of one install): controller names are then reused.
	SeveralManagers bool
	// PodWebhooksConfiguration names kvnet's MutatingWebhookConfiguration,
	// whose pod webhooks the leader then keeps in step with the config
	// (webhook.Registrar); empty leaves registration to whoever installed it.
	PodWebhooksConfiguration string
	// Certs are the certificate settings; the zero value is external
	// (cert-manager or a mounted Secret fills --cert-dir).
	Certs CertFlags
}

func (o *ServeOptions) register(c *cobra.Command) {
	fs := c.Flags()
	fs.StringVar(&o.ConfigPath, "config", "/etc/kvnet/config.yaml", "policy file, reloaded when it changes")
	fs.StringVar(&o.CertDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "directory with tls.crt and tls.key, reloaded when they change")
	fs.IntVar(&o.Port, "webhook-port", 9443, "HTTPS port of the admission webhooks")
	fs.StringVar(&o.Host, "webhook-host", "", "address the webhooks bind (default all)")
	registerMetricsFlags(fs, &o.MetricsAddr, &o.MetricsInsecure, &o.MetricsCertDir)
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "health and readiness probe address")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", "", "serve Go's CPU, heap and goroutine profiles at /debug/pprof/ on this loopback host:port (reach it with kubectl port-forward); empty: off")
	fs.StringVar(&o.TLSMinVersion, "tls-min-version", "1.2", "minimum TLS version of the webhooks: 1.2 or 1.3")
	fs.BoolVar(&o.LeaderElect, "leader-elect", false, "elect a leader for the controllers (webhooks run on every replica)")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "kvnet-controllers", "lease name for leader election")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "kvnet's own namespace (always excluded from admission)")
	fs.StringVar(&o.PodWebhooksConfiguration, "pod-webhooks-configuration", "", "MutatingWebhookConfiguration whose pod webhooks follow the config: added when a feature needs them, removed when none does (empty: off)")
}

// Scheme knows every kind kvnet reads or writes.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, nadv1.AddToScheme, kubevirtv1.AddToScheme, ipamv1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err) // static registrations; cannot fail at run time
		}
	}
	return s
}

func tlsVersion(s string) (uint16, error) {
	switch s {
	case "1.2", "VersionTLS12":
		return tls.VersionTLS12, nil
	case "1.3", "VersionTLS13":
		return tls.VersionTLS13, nil
	}
	return 0, fmt.Errorf("--tls-min-version: want 1.2 or 1.3, got %q", s)
}

// NewManager builds the manager with kvnet's webhooks and controllers on it.
// Tests call it with envtest's rest.Config.
func NewManager(ctx context.Context, restCfg *rest.Config, o ServeOptions, cfg *config.Source) (manager.Manager, error) {
	mgr, metrics, err := newWebhookManagerBase(restCfg, o)
	if err != nil {
		return nil, err
	}
	facts, err := startAdmissionInformers(ctx, mgr)
	if err != nil {
		return nil, err
	}
	// What `kvnet webhook` runs besides the VM and VMI webhooks, in order.
	// Each capability gets only what it uses and hands in its steps.
	// A peer's webhook kvnet calls (kubemacpool, where the API server
	// calls it before kvnet and not again) gets at most half of kvnet's
	// own default timeout (10 s), so that kvnet still answers when the
	// peer does not.
	caps := Capabilities{PeerWebhooks: &peerwebhook.Client{MaxTimeout: 5 * time.Second}}
	if err := SetUpCerts(ctx, mgr, o.Certs, &o); err != nil {
		return nil, err
	}
	// Self-managed certificates are in --cert-dir now, for a
	// --metrics-cert-dir that names it.
	if err := metrics.checkCertDir(); err != nil {
		return nil, err
	}
	if caps.Migration, err = migrationNetworks(ctx, mgr, cfg, o.Namespace); err != nil {
		return nil, err
	}
	if caps.PersistentIPs, err = persistentIPs(ctx, mgr, cfg, facts); err != nil {
		return nil, err
	}
	if err := migrationProxyExtension(ctx, mgr, o.Namespace); err != nil {
		return nil, err
	}
	webhook.Register(mgr.GetWebhookServer(), webhook.NewHandlers(cfg, facts, Chains(caps)))
	if o.PodWebhooksConfiguration != "" {
		if err := mgr.Add(&webhook.Registrar{
			Name: o.PodWebhooksConfiguration, Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(),
			Config: cfg, Log: mgr.GetLogger().WithName("registrar"),
		}); err != nil {
			return nil, err
		}
	}
	if err := addWebhookChecks(mgr); err != nil {
		return nil, err
	}
	return mgr, nil
}

// newWebhookManagerBase is the manager with kvnet's webhook server (TLS
// floor, HTTP/1.1), its metrics listener, probes, cache and leader
// election, before anything of kvnet's is on it.
func newWebhookManagerBase(restCfg *rest.Config, o ServeOptions) (manager.Manager, MetricsServing, error) {
	minTLS, err := tlsVersion(o.TLSMinVersion)
	if err != nil {
		return nil, MetricsServing{}, err
	}
	tlsOpts := []func(*tls.Config){
		func(c *tls.Config) { c.MinVersion = minTLS },
		// HTTP/2 stays off: its rapid-reset and stream exhaustion CVEs are
		// not worth the gain for one request per admission.
		func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} },
	}
	metrics := o.metrics()
	// The metrics listener follows --tls-min-version too.
	mo, err := managerOptions(metrics, o.ProbeAddr, o.LeaderElect, o.LeaderElectionID, o.Namespace, tlsOpts[0])
	if err != nil {
		return nil, MetricsServing{}, err
	}
	mo.LeaseDuration, mo.RenewDeadline, mo.RetryPeriod = durationOrNil(o.LeaseDuration), durationOrNil(o.RenewDeadline), durationOrNil(o.RetryPeriod)
	if err := pprofAddress(o.PprofAddr); err != nil {
		return nil, MetricsServing{}, err
	}
	mo.PprofBindAddress = o.PprofAddr
	mo.WebhookServer = ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: o.Host, Port: o.Port, CertDir: o.CertDir, TLSOpts: tlsOpts,
	})
	// Only what kvnet reads of each object stays in its informers (cache.go).
	mo.Cache = cacheOptions()
	mo.Client = client.Options{Cache: &client.CacheOptions{Unstructured: false}}
	mo.Controller = ctrlconfig.Controller{SkipNameValidation: &o.SeveralManagers}
	if err := RegisterMetrics(ctrlmetrics.Registry); err != nil {
		return nil, MetricsServing{}, fmt.Errorf("registering metrics: %w", err)
	}
	mgr, err := ctrl.NewManager(restCfg, mo)
	if err != nil {
		return nil, MetricsServing{}, fmt.Errorf("creating manager: %w", err)
	}
	return mgr, metrics, nil
}

// startAdmissionInformers starts, with the manager, the informers
// admission reads (readiness waits for them rather than the first request
// paying for them) and returns the facts admission reads through them.
func startAdmissionInformers(ctx context.Context, mgr manager.Manager) (*lookup.Reader, error) {
	// Start the informers admission reads with the manager, not lazily on the
	// first request, and report ready only once they have synced.
	// The webhook configurations are how kvnet sees network-resources-
	// injector (lookup.Reader.ResourceInjector).
	for _, obj := range []client.Object{&nadv1.NetworkAttachmentDefinition{}, lookup.NamespaceMetadata(), &admissionregv1.MutatingWebhookConfiguration{}} {
		if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
			return nil, fmt.Errorf("starting informer for %T: %w", obj, err)
		}
	}
	// The migration-ids validator asks which live VMIMs hold a migration
	// ID: an index on the VMIM informer (which the status rewrite reads too).
	if err := indexMigrationIDs(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	// The MAC check beside a MAC pool asks which VMs hold a MAC: an index
	// on the VM informer (which the persistent-IPs controller reads too).
	if err := indexMACs(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	facts := lookup.NewReader(mgr.GetCache())
	if err := facts.WatchKubeVirt(ctx, mgr.GetCache()); err != nil {
		return nil, err
	}
	return facts, nil
}

// addWebhookChecks adds the liveness check and the readiness checks: the
// webhook server serves TLS, and the informers have synced.
func addWebhookChecks(mgr manager.Manager) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook-tls", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("informers", func(*http.Request) error {
		c, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(c) {
			return fmt.Errorf("informer caches have not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	return nil
}

// metrics is how this process serves /metrics.
func (o ServeOptions) metrics() MetricsServing {
	return MetricsServing{BindAddress: o.MetricsAddr, Insecure: o.MetricsInsecure, CertDir: o.MetricsCertDir}
}

func durationOrNil(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

func webhookCommand() *cobra.Command {
	var o ServeOptions
	var zo zap.Options
	c := &cobra.Command{
		Use:   "webhook",
		Short: "Serve kvnet's admission webhooks and run its controllers",
		RunE: func(c *cobra.Command, _ []string) error {
			// Refused metrics flags fail before anything else is read.
			if _, err := o.metrics().serverOptions(); err != nil {
				return err
			}
			if err := pprofAddress(o.PprofAddr); err != nil {
				return err
			}
			log := zap.New(zap.UseFlagOptions(&zo))
			ctrl.SetLogger(log)
			w, err := config.NewWatcher(o.ConfigPath, o.Namespace, log.WithName("config"))
			if err != nil {
				return err
			}
			restCfg, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("finding the cluster: %w", err)
			}
			mgr, err := NewManager(c.Context(), restCfg, o, &w.Source)
			if err != nil {
				return err
			}
			if err := mgr.Add(w); err != nil {
				return err
			}
			info := version.Get()
			log.Info("starting kvnet", "version", info.Version, "commit", info.Commit, "webhookPort", o.Port, "config", o.ConfigPath)
			return mgr.Start(c.Context())
		},
	}
	o.register(c)
	o.Certs.register(c)
	gofs := goFlagSet()
	zo.BindFlags(gofs)
	c.Flags().AddGoFlagSet(gofs)
	return c
}

// pprofAddress accepts an empty --pprof-bind-address (off) or a loopback
// one: the profiles show memory contents and have no authentication, so
// only a port-forward into the pod may reach them.
func pprofAddress(addr string) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err == nil && host != "localhost" {
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			err = errors.New("not a loopback address")
		}
	}
	if err != nil {
		return fmt.Errorf("--pprof-bind-address %q: %v; the profiles have no authentication, so they are served only on a loopback host:port (127.0.0.1:6060, [::1]:6060, localhost:6060), reached with kubectl port-forward", addr, err)
	}
	return nil
}
