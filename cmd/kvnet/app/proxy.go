package app

import (
	"context"
	"fmt"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/lookup"
	"github.com/kvnet/kvnet/proxy"
	"github.com/kvnet/kvnet/webhook"
)

func init() {
	serveExtensions = append(serveExtensions, migrationProxyExtension)
	extraCommands = append(extraCommands, proxyCommand)
}

// migrationProxyExtension serves the migration proxy's status rewrite on
// every webhook replica. The API server sends it nothing unless the
// MigrationProxyWebhook rule is registered; register that rule only where
// `kvnet proxy` runs, since without published relays the rewrite holds every
// decentralized migration source back (by design: it never lets the
// unreachable remote address through).
func migrationProxyExtension(ctx context.Context, mgr manager.Manager, _ *config.Source, _ lookup.Facts, _ *webhook.HandlerOptions, _ *ServeOptions) error {
	// VMIMs come from an informer started with the manager (no API call per
	// admission); the API is read only when the cache does not know the
	// migration a VMI names yet.
	if _, err := mgr.GetCache().GetInformer(ctx, &kubevirtv1.VirtualMachineInstanceMigration{}); err != nil {
		return fmt.Errorf("starting the VirtualMachineInstanceMigration informer: %w", err)
	}
	h := &proxy.StatusRewriter{Reader: mgr.GetCache(), APIReader: mgr.GetAPIReader()}
	mgr.GetWebhookServer().Register(webhook.PathMutateVMIMigrationStatus, &admission.Webhook{Handler: h, RecoverPanic: ptr.To(true)})
	return nil
}

// ProxyOptions are `kvnet proxy`'s process settings.
type ProxyOptions struct {
	AdvertiseAddress string
	DialTimeout      time.Duration
	MetricsAddr      string
	ProbeAddr        string
	LeaderElect      bool
	LeaderElectionID string
	Namespace        string
}

// NewProxyManager builds the manager of `kvnet proxy`: the relay controller
// only, under leader election so one instance owns all relays. Tests call it
// with envtest's rest.Config.
func NewProxyManager(restCfg *rest.Config, o ProxyOptions) (manager.Manager, error) {
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                  Scheme(),
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:  o.ProbeAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: o.Namespace,
		// A new leader must not open relays while the old one may still
		// hold them: release the lease on a clean shutdown so hand-over is quick.
		LeaderElectionReleaseOnCancel: true,
		// A process runs one proxy manager, but tests build one per run
		// (go test -count=N): the controller-name check is global.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the proxy manager: %w", err)
	}
	c := &proxy.Controller{Address: o.AdvertiseAddress, DialTimeout: o.DialTimeout, Log: ctrl.Log.WithName("migration-proxy")}
	if err := proxy.Setup(mgr, c); err != nil {
		return nil, fmt.Errorf("setting up the migration proxy: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

func proxyCommand() *cobra.Command {
	var o ProxyOptions
	var zo zap.Options
	c := &cobra.Command{
		Use:   "proxy",
		Short: "Relay decentralized live migrations through this pod's cross-cluster address",
		Long: `Runs beside KubeVirt's synchronization controller on the source cluster. For
each VMI that is the source of a decentralized live migration (a VMIM with
spec.sendTo) and whose target has reported its endpoint
(status.migrationState.targetState), it opens one TCP relay per remote
migration port on --advertise-address and publishes the mapping in the VMI
annotation kvnet.io/migration-proxy. kvnet's webhook then points the source
virt-handler at the relays. See docs/migration-proxy.md.`,
		RunE: func(c *cobra.Command, _ []string) error {
			log := zap.New(zap.UseFlagOptions(&zo))
			ctrl.SetLogger(log)
			if o.AdvertiseAddress == "" {
				return fmt.Errorf("--advertise-address is required: the proxy pod's address on the migration network the source virt-handlers reach")
			}
			restCfg, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("finding the cluster: %w", err)
			}
			mgr, err := NewProxyManager(restCfg, o)
			if err != nil {
				return err
			}
			log.Info("starting kvnet proxy", "advertiseAddress", o.AdvertiseAddress)
			return mgr.Start(c.Context())
		},
	}
	fs := c.Flags()
	fs.StringVar(&o.AdvertiseAddress, "advertise-address", os.Getenv("KVNET_PROXY_ADDRESS"), "IP the relays listen on and that is published to virt-handler (the pod's migration0/crosscluster0 address)")
	fs.DurationVar(&o.DialTimeout, "dial-timeout", proxy.DefaultDialTimeout, "timeout of each dial to the remote migration target")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "Prometheus metrics address; 0 disables")
	fs.StringVar(&o.ProbeAddr, "health-probe-bind-address", ":8081", "health probe address")
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "elect one active proxy; keep on with more than one replica")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "kvnet-migration-proxy", "lease name for leader election")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "namespace of the leader-election lease")
	gofs := goFlagSet()
	zo.BindFlags(gofs)
	fs.AddGoFlagSet(gofs)
	return c
}
