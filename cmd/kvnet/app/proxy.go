package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/caexchange"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/webhook"
)

// migrationProxyExtension serves the migration proxy's status rewrite on
// every webhook replica. The API server sends it nothing unless the
// MigrationProxyWebhook rule is registered; register that rule only where
// `kvnet proxy` runs, since without published relays the rewrite holds every
// decentralized migration source back (by design: it never lets the
// unreachable remote address through).
func migrationProxyExtension(ctx context.Context, mgr manager.Manager, namespace string) error {
	// VMIMs come from an informer started with the manager (no API call per
	// admission); the API is read only when the cache does not know the
	// migration a VMI names yet.
	if _, err := mgr.GetCache().GetInformer(ctx, &kubevirtv1.VirtualMachineInstanceMigration{}); err != nil {
		return fmt.Errorf("starting the VirtualMachineInstanceMigration informer: %w", err)
	}
	ms := store.MappingStore{Namespace: namespace}
	mappings, err := mappingsCache(mgr, ms)
	if err != nil {
		return err
	}
	h := &proxy.StatusRewriter{Reader: mgr.GetCache(), APIReader: mgr.GetAPIReader(), Store: ms, MappingsReader: mappings}
	mgr.GetWebhookServer().Register(webhook.PathMutateVMIMigrationStatus, webhook.Webhook(h))
	return nil
}

// mappingsCache is an informer on the one ConfigMap of published mappings,
// started with the manager.
func mappingsCache(mgr manager.Manager, ms store.MappingStore) (cache.Cache, error) {
	name := ms.Name
	if name == "" {
		name = store.DefaultMappingsName
	}
	c, _, err := configMapCache(mgr, ms.Namespace, name)
	if err != nil {
		return nil, err
	}
	return c, mgr.Add(c)
}

// ProxyOptions are `kvnet proxy`'s process settings.
type ProxyOptions struct {
	// AdvertiseAddress is the in-cluster address the source listeners bind
	// and publish (the pod's migration0 address).
	AdvertiseAddress string
	// HopListen is the cross-cluster hop listener (crosscluster0 address
	// and port); HopListener, if set, is used instead (tests hand over a
	// bound listener rather than racing for a free port).
	HopListen   string
	HopListener net.Listener
	// Cert is this proxy's certificate for the hop; Peers the other
	// clusters' proxies; Mode the hop mode this proxy asks for; Modes the
	// hop modes it accepts (empty: both).
	Cert tls.Certificate
	// CertFile and KeyFile, when set, are where Cert is read from and
	// read again on change (controller-runtime's certwatcher), so a
	// cert-manager renewal needs no restart; the peers' CA files are
	// reloaded too (proxy.CAReloader).
	CertFile, KeyFile string
	Peers             []*proxy.Peer
	Mode              hop.Mode
	Modes             []hop.Mode
	// AllowedSources are the in-cluster migration ranges the source
	// listeners accept clients from.
	AllowedSources []netip.Prefix
	MaxMigrations  int
	// MaxPerNamespace is one namespace's share of MaxMigrations;
	// MaxRelayConns caps each source listener's clients.
	MaxPerNamespace int
	MaxRelayConns   int
	QueueWait       time.Duration
	DialTimeout     time.Duration
	IdleTimeout     time.Duration
	// CASync keeps KubeVirt's CA bundles in step with the peers over the
	// hop (needs the hop listener); KubeVirtNamespace is where kubevirt-ca
	// and kubevirt-external-ca live; CASyncInterval is the periodic offer.
	CASync            bool
	KubeVirtNamespace string
	CASyncInterval    time.Duration
	// ReceiveIdentities lets peers send the network identity of a
	// migration into this cluster: the hop listener checks it
	// and writes the receiving VM's IPAMClaims. Off, a peer's identity is
	// refused (identity-exchange-off).
	ReceiveIdentities bool
	// SendIdentities offers each source VM's network identity (its claims'
	// IPs and its MACs) to the peer a sending VMIM names, when the proxy
	// first sees the VMIM.
	SendIdentities bool
	// LeaseCheckInterval is how often, with SendIdentities, the proxy asks
	// each peer about the leases kept here (proxy.LeaseChecker); 0 is
	// proxy.DefaultLeaseCheckInterval.
	LeaseCheckInterval time.Duration

	// MetricsAddr, MetricsInsecure and MetricsCertDir are where and how
	// /metrics is served (MetricsServing): HTTPS with the API server's
	// authentication and authorization unless MetricsInsecure, which only
	// a loopback MetricsAddr may have. In sidecar mode the pod's addresses
	// include the migration networks.
	MetricsAddr      string
	MetricsInsecure  bool
	MetricsCertDir   string
	ProbeAddr        string
	LeaderElect      bool
	LeaderElectionID string
	Namespace        string
	// CreateObjects lets the proxy create its Lease and its mappings and
	// bindings ConfigMaps in Namespace when they are missing. Off (the
	// chart's way), the chart creates them and the proxy only gets and
	// updates them, so its ServiceAccount needs no create there; a missing
	// one is logged by name.
	CreateObjects bool
}

// NewProxyManager builds the manager of `kvnet proxy`: the source-side
// relay controller and the target-side hop listener, under leader election
// so one instance owns both ends in a cluster. Tests call it with
// envtest's rest.Config.
func NewProxyManager(restCfg *rest.Config, o ProxyOptions) (manager.Manager, error) {
	if err := proxy.CheckPeers(o.Peers); err != nil {
		return nil, fmt.Errorf("--peers: %w", err)
	}
	mgr, err := newProxyManagerBase(restCfg, o)
	if err != nil {
		return nil, err
	}
	log := ctrl.Log.WithName("migration-proxy")
	getCert, err := watchCertificate(mgr, o, log)
	if err != nil {
		return nil, err
	}
	// One limiter for both sides: a migration relayed here holds one slot.
	limiter := &proxy.Limiter{Max: o.MaxMigrations, PerNamespace: o.MaxPerNamespace, Wait: o.QueueWait}
	c, err := setUpSourceSide(mgr, o, getCert, limiter, log)
	if err != nil {
		return nil, err
	}
	if o.HopListen != "" || o.HopListener != nil {
		if err := setUpTargetSide(mgr, o, c.Dialer, getCert, limiter, log); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// newProxyManagerBase is the proxy's manager with its metrics listener,
// probes and leader election (on a lease the chart created, unless
// CreateObjects), before any proxy component is on it.
func newProxyManagerBase(restCfg *rest.Config, o ProxyOptions) (manager.Manager, error) {
	metrics := o.metrics()
	mo, err := managerOptions(metrics, o.ProbeAddr, o.LeaderElect, o.LeaderElectionID, o.Namespace)
	if err != nil {
		return nil, err
	}
	if err := metrics.checkCertDir(); err != nil {
		return nil, err
	}
	// A process runs one proxy manager, but tests build one per run
	// (go test -count=N): the controller-name check is global.
	mo.Controller = ctrlconfig.Controller{SkipNameValidation: ptr.To(true)}
	var lease *existingLease
	if o.LeaderElect && !o.CreateObjects {
		lease = &existingLease{key: types.NamespacedName{Namespace: o.Namespace, Name: o.LeaderElectionID}}
		mo.LeaderElectionResourceLockInterface = lease
		mo.RenewDeadline = ptr.To(leaderRenewDeadline)
	}
	if err := RegisterMetrics(ctrlmetrics.Registry); err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	mgr, err := ctrl.NewManager(restCfg, mo)
	if err != nil {
		return nil, fmt.Errorf("creating the proxy manager: %w", err)
	}
	if lease != nil {
		if err := lease.fill(restCfg, mgr); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// setUpSourceSide adds the source side: the controller that opens a
// listener per remote migration port, publishes the mappings and relays
// each stream to the peer (offering the VM's network identity first when
// SendIdentities).
func setUpSourceSide(mgr manager.Manager, o ProxyOptions, getCert func() (*tls.Certificate, error), limiter *proxy.Limiter, log logr.Logger) (*proxy.Controller, error) {
	c := &proxy.Controller{
		Address: o.AdvertiseAddress, DialTimeout: o.DialTimeout, Log: log,
		Store: store.MappingStore{Namespace: o.Namespace, Create: o.CreateObjects}, Peers: o.Peers,
		Dialer:  &proxy.Dialer{Cert: o.Cert, GetCert: getCert, Mode: o.Mode, VerdictWait: proxy.VerdictWait(o.QueueWait, o.DialTimeout)},
		Limiter: limiter, AllowedSources: o.AllowedSources, IdleTimeout: o.IdleTimeout, MaxRelayConns: o.MaxRelayConns,
	}
	if o.SendIdentities {
		c.Identities = identitySource{mgr.GetAPIReader()}
		c.Leases = leaseMarker{r: mgr.GetAPIReader(), c: mgr.GetClient()}
		if err := mgr.Add(&proxy.LeaseChecker{
			Leases: leaseStore{r: mgr.GetAPIReader(), c: mgr.GetClient(), log: log.WithName("leases")},
			Dialer: c.Dialer, Peers: o.Peers, Interval: o.LeaseCheckInterval, Log: log.WithName("leases"),
		}); err != nil {
			return nil, err
		}
	}
	if err := proxy.Setup(mgr, c); err != nil {
		return nil, fmt.Errorf("setting up the migration proxy: %w", err)
	}
	return c, nil
}

// setUpTargetSide adds the target side: the hop listener, which takes
// streams and identities from the peers only, its bindings store, the
// resolver of receiving VMIMs and virt-handler addresses, and, when
// CASync, the KubeVirt CA exchange over dialer.
func setUpTargetSide(mgr manager.Manager, o ProxyOptions, dialer *proxy.Dialer, getCert func() (*tls.Certificate, error), limiter *proxy.Limiter, log logr.Logger) error {
	if len(o.Peers) == 0 {
		return fmt.Errorf("the hop listener needs at least one peer: it accepts only peer proxies")
	}
	bc, _, err := configMapCache(mgr, o.Namespace, store.DefaultBindingsName)
	if err != nil {
		return err
	}
	if err := mgr.Add(bc); err != nil {
		return err
	}
	bindings, err := proxy.SetupBindings(mgr, store.BindingStore{Namespace: o.Namespace, Create: o.CreateObjects}, bc, log.WithName("bindings"))
	if err != nil {
		return err
	}
	pools, err := inClusterPoolCache(mgr, o.Namespace)
	if err != nil {
		return err
	}
	if err := mgr.Add(pools); err != nil {
		return err
	}
	if err := indexMigrationIDs(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	resolver := &proxy.ClusterResolver{Reader: mgr.GetCache(), Handlers: migration.HandlerAddresses{Reader: pools, Namespace: o.Namespace}}
	ts := &proxy.TargetServer{
		Cert: o.Cert, GetCert: getCert, Peers: o.Peers, Modes: o.Modes, Resolver: resolver,
		Limiter: limiter, DialTimeout: o.DialTimeout, IdleTimeout: o.IdleTimeout, Log: log.WithName("hop"),
		Bindings: bindings,
	}
	if o.ReceiveIdentities {
		ts.Identities = newIdentityReceiver(mgr)
		ts.Holders = vmHolders{mgr.GetAPIReader()}
	}
	if o.CASync {
		if err := setupCASync(mgr, o, dialer, ts); err != nil {
			return fmt.Errorf("setting up the KubeVirt CA exchange: %w", err)
		}
	}
	ln := o.HopListener
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", o.HopListen); err != nil {
				return fmt.Errorf("opening the hop listener on %s: %w", o.HopListen, err)
			}
		}
		log.Info("hop listener open", "listen", ln.Addr().String())
		return ts.Serve(ctx, ln)
	}))
}

// watchCertificate reloads the proxy's certificate from o.CertFile (nil
// without one: o.Cert serves as given) and the peers' CA files, both as
// manager runnables on every replica.
func watchCertificate(mgr manager.Manager, o ProxyOptions, log logr.Logger) (func() (*tls.Certificate, error), error) {
	var peerFiles bool
	for _, p := range o.Peers {
		peerFiles = peerFiles || p.CAFile != ""
	}
	if peerFiles {
		if err := mgr.Add(&proxy.CAReloader{Peers: o.Peers, Log: log.WithName("peer-cas")}); err != nil {
			return nil, err
		}
	}
	if o.CertFile == "" {
		return nil, nil
	}
	cw, err := certwatcher.New(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("--cert-file/--key-file: %w", err)
	}
	cw.RegisterCallback(func(c tls.Certificate) {
		if c.Leaf != nil {
			log.Info("proxy certificate reloaded", "file", o.CertFile, "notAfter", c.Leaf.NotAfter)
		}
	})
	if err := mgr.Add(cw); err != nil {
		return nil, err
	}
	return func() (*tls.Certificate, error) { return cw.GetCertificate(nil) }, nil
}

// metrics is how this process serves /metrics.
func (o ProxyOptions) metrics() MetricsServing {
	return MetricsServing{BindAddress: o.MetricsAddr, Insecure: o.MetricsInsecure, CertDir: o.MetricsCertDir}
}

// PeerFile is the format of --peers: the other clusters' proxies.
type PeerFile struct {
	Peers []struct {
		// Name is the peer cluster's name (used in logs, metrics and the
		// migration binding).
		Name string `json:"name"`
		// Addresses are its proxies' hop listeners, host:port.
		Addresses []string `json:"addresses"`
		// CAFile is the PEM bundle its proxy certificates chain to.
		CAFile string `json:"caFile"`
		// ServerName its serving certificate carries (default: name).
		ServerName string `json:"serverName,omitempty"`
		// ConnectHosts are the hosts of spec.sendTo.connectURL that lead
		// to it; optional with a single peer.
		ConnectHosts []string `json:"connectHosts,omitempty"`
	} `json:"peers"`
}

// LoadPeers reads a --peers file; errors name the field.
func LoadPeers(path string) ([]*proxy.Peer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading --peers: %w", err)
	}
	var f PeerFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("parsing --peers %s: %w", path, err)
	}
	var out []*proxy.Peer
	seen := map[string]bool{}
	for i, p := range f.Peers {
		field := fmt.Sprintf("peers[%d]", i)
		if p.Name == "" || seen[p.Name] {
			return nil, fmt.Errorf("%s.name: empty or repeated %q", field, p.Name)
		}
		seen[p.Name] = true
		if len(p.Addresses) == 0 {
			return nil, fmt.Errorf("%s.addresses: at least one host:port", field)
		}
		for j, a := range p.Addresses {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("%s.addresses[%d]: %w", field, j, err)
			}
		}
		pem, err := os.ReadFile(p.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%s.caFile: %w", field, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s.caFile %s: no PEM certificate", field, p.CAFile)
		}
		out = append(out, &proxy.Peer{Name: p.Name, Addresses: p.Addresses, CAs: pool, CAFile: p.CAFile, ServerName: p.ServerName, ConnectHosts: p.ConnectHosts})
	}
	if err := proxy.CheckPeers(out); err != nil {
		return nil, fmt.Errorf("--peers %s: %w", path, err)
	}
	return out, nil
}

func proxyCommand() *cobra.Command {
	var f proxyFlags
	var zo zap.Options
	c := &cobra.Command{
		Use:   "proxy",
		Short: "Relay decentralized live migrations between clusters, proxy to proxy over mutual TLS",
		Long: `Runs in each cluster of a decentralized live migration, in a pod that holds
an in-cluster migration0 address and a crosscluster0 address.

Source side: for each VMI that is the source of a decentralized migration (a
VMIM with spec.sendTo) whose target has reported its endpoint, it opens one
listener per remote migration port on --advertise-address, publishes the
mapping in a ConfigMap only it may write, and kvnet's webhook points the
source virt-handler at those listeners. Each stream goes to the target
cluster's proxy (--peers) over mutual TLS.

Target side: --hop-listen accepts streams from peer proxies only, checks the
peer, the migration ID and the port against this cluster's receiving VMIM and
its VMI's targetState, and dials that in-cluster endpoint.

See docs/migration-proxy.md.`,
		RunE: func(c *cobra.Command, _ []string) error {
			// Refused metrics flags fail before anything else is read.
			if _, err := f.o.metrics().serverOptions(); err != nil {
				return err
			}
			log := zap.New(zap.UseFlagOptions(&zo))
			ctrl.SetLogger(log)
			o, err := f.options()
			if err != nil {
				return err
			}
			restCfg, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("finding the cluster: %w", err)
			}
			mgr, err := NewProxyManager(restCfg, o)
			if err != nil {
				return err
			}
			log.Info("starting kvnet proxy", "advertiseAddress", o.AdvertiseAddress, "hopListen", o.HopListen, "mode", o.Mode.String(), "peers", len(o.Peers))
			return mgr.Start(c.Context())
		},
	}
	f.register(c.Flags())
	gofs := goFlagSet()
	zo.BindFlags(gofs)
	c.Flags().AddGoFlagSet(gofs)
	return c
}

// proxyFlags are `kvnet proxy`'s flags as given: ProxyOptions, and the
// values options turns into them.
type proxyFlags struct {
	o                                                             ProxyOptions
	certFile, keyFile, peersFile, mode, modes, advertiseIf, hopIf string
	hopPort                                                       int
	sources                                                       []string
}

// register defines the flags on fs.
func (f *proxyFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.o.AdvertiseAddress, "advertise-address", os.Getenv("KVNET_PROXY_ADDRESS"), "in-cluster IP the source listeners bind and that is published to virt-handler (the pod's migration0 address)")
	fs.StringVar(&f.advertiseIf, "advertise-interface", "", "take --advertise-address from this interface (migration0: the address kvnet's migration-pods webhook gave the pod)")
	fs.StringVar(&f.hopIf, "hop-interface", "", "take the hop listener's host from this interface (crosscluster0)")
	fs.IntVar(&f.hopPort, "hop-port", 9444, "port of the hop listener with --hop-interface")
	fs.StringVar(&f.o.HopListen, "hop-listen", "", "host:port of the cross-cluster hop listener (the pod's crosscluster0 address); empty: no target side")
	fs.StringVar(&f.certFile, "cert-file", "/etc/kvnet/proxy/tls.crt", "this proxy's certificate (server and client use) for the hop")
	fs.StringVar(&f.keyFile, "key-file", "/etc/kvnet/proxy/tls.key", "its key")
	fs.StringVar(&f.peersFile, "peers", "", "YAML file of peer proxies (name, addresses, caFile, serverName, connectHosts); empty: dial remote nodes directly (flat networks only)")
	fs.StringVar(&f.mode, "mode", "tls", "hop mode this proxy asks for: tls (all encrypted) or authenticated (mutual-TLS handshake, then plain bytes; only with KubeVirt migration TLS on)")
	fs.StringVar(&f.modes, "accept-modes", "", "comma-separated hop modes accepted from peers (default both)")
	fs.StringSliceVar(&f.sources, "allowed-sources", nil, "CIDRs the source listeners accept clients from (the in-cluster migration ranges); required")
	fs.IntVar(&f.o.MaxMigrations, "max-migrations", proxy.DefaultMaxMigrations, "migrations relayed at once; more wait --queue-wait, then are refused")
	fs.IntVar(&f.o.MaxPerNamespace, "max-migrations-per-namespace", 0, "one namespace's share of --max-migrations (0: half of it, rounded up), so one tenant cannot hold every slot")
	fs.IntVar(&f.o.MaxRelayConns, "max-relay-connections", proxy.DefaultMaxRelayConns, "clients one source listener relays at once; more are closed at once")
	fs.DurationVar(&f.o.QueueWait, "queue-wait", proxy.DefaultQueueWait, "how long a migration over the cap waits for a slot")
	fs.DurationVar(&f.o.DialTimeout, "dial-timeout", proxy.DefaultDialTimeout, "timeout of each dial (peer proxy, target virt-handler)")
	fs.DurationVar(&f.o.IdleTimeout, "idle-timeout", proxy.DefaultIdleTimeout, "close a stream that moved no byte for this long")
	fs.BoolVar(&f.o.CASync, "kubevirt-ca-sync", true, "keep KubeVirt's CA bundles in step with the peers over the hop: offer kubevirt-ca, store theirs in kubevirt-external-ca (with --peers and the hop listener)")
	fs.StringVar(&f.o.KubeVirtNamespace, "kubevirt-namespace", caexchange.DefaultKubeVirtNamespace, "KubeVirt's namespace: kubevirt-ca and kubevirt-external-ca")
	fs.DurationVar(&f.o.CASyncInterval, "kubevirt-ca-sync-interval", caexchange.DefaultCASyncInterval, "how often the KubeVirt CA bundle is offered to every peer, besides on each change")
	fs.BoolVar(&f.o.ReceiveIdentities, "receive-network-identities", true, "take the network identity (claim IPs and MACs) of a migration from the peer it is bound to and write it into the receiving VM's IPAMClaims (with --peers and the hop listener)")
	fs.BoolVar(&f.o.SendIdentities, "send-network-identities", true, "offer a migrating VM's network identity (claim IPs and MACs) to the peer its sending VMIM names, before the target pod exists (with --peers)")
	fs.DurationVar(&f.o.LeaseCheckInterval, "lease-check-interval", proxy.DefaultLeaseCheckInterval, "with --send-network-identities: how often each peer is asked whether the VMs that moved there still exist, to release the leases kept here for them")
	registerMetricsFlags(fs, &f.o.MetricsAddr, &f.o.MetricsInsecure, &f.o.MetricsCertDir)
	fs.StringVar(&f.o.ProbeAddr, "health-probe-bind-address", ":8081", "health probe address")
	fs.BoolVar(&f.o.LeaderElect, "leader-elect", true, "elect one active proxy; keep on with more than one replica")
	fs.StringVar(&f.o.LeaderElectionID, "leader-election-id", "kvnet-migration-proxy", "lease name for leader election")
	fs.StringVar(&f.o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "kvnet's namespace: the lease and the mappings ConfigMap")
	fs.BoolVar(&f.o.CreateObjects, "create-objects", false, "create the lease (--leader-election-id) and the ConfigMaps kvnet-migration-proxy-mappings and kvnet-migration-proxy-bindings in --namespace when missing (needs create on leases and configmaps there); off: kvnet's chart creates them and a missing one is logged by name")
}

// options turns the flags into the proxy's options, one named step each:
// the addresses, the hop modes, the allowed sources, the peers and the
// certificate.
func (f *proxyFlags) options() (ProxyOptions, error) {
	o := f.o
	for _, step := range []func(*ProxyOptions) error{f.addresses, f.hopModes, f.allowedSources, f.peers} {
		if err := step(&o); err != nil {
			return ProxyOptions{}, err
		}
	}
	return o, nil
}

// addresses takes the advertise address and the hop listener's host from
// their interfaces when asked, and refuses an advertise address that is no
// IP.
func (f *proxyFlags) addresses(o *ProxyOptions) error {
	if o.AdvertiseAddress == "" && f.advertiseIf != "" {
		a, err := interfaceIP(f.advertiseIf)
		if err != nil {
			return fmt.Errorf("--advertise-interface: %w", err)
		}
		o.AdvertiseAddress = a
	}
	if o.HopListen == "" && f.hopIf != "" {
		a, err := interfaceIP(f.hopIf)
		if err != nil {
			return fmt.Errorf("--hop-interface: %w", err)
		}
		o.HopListen = net.JoinHostPort(a, strconv.Itoa(f.hopPort))
	}
	if net.ParseIP(o.AdvertiseAddress) == nil {
		return fmt.Errorf("--advertise-address %q: want the proxy pod's in-cluster migration address (an IP)", o.AdvertiseAddress)
	}
	return nil
}

// hopModes parses the mode this proxy asks for and those it accepts.
func (f *proxyFlags) hopModes(o *ProxyOptions) error {
	var err error
	if o.Mode, err = hop.ParseMode(f.mode); err != nil {
		return fmt.Errorf("--mode: %w", err)
	}
	if f.modes == "" {
		return nil
	}
	for _, m := range splitComma(f.modes) {
		pm, err := hop.ParseMode(m)
		if err != nil {
			return fmt.Errorf("--accept-modes: %w", err)
		}
		o.Modes = append(o.Modes, pm)
	}
	return nil
}

// allowedSources parses the client ranges of the source listeners. Safe by
// default: they take only the clients they are told of; a flat lab network
// says 0.0.0.0/0 aloud.
func (f *proxyFlags) allowedSources(o *ProxyOptions) error {
	for _, s := range f.sources {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("--allowed-sources %q: %w", s, err)
		}
		o.AllowedSources = append(o.AllowedSources, p)
	}
	if len(o.AllowedSources) == 0 {
		return fmt.Errorf("--allowed-sources: name the in-cluster migration ranges the source virt-handlers connect from (the chart passes the in-cluster pool's CIDR); 0.0.0.0/0 and ::/0 accept any client")
	}
	return nil
}

// peers loads the peer proxies and this proxy's certificate for the hop,
// when a peers file is given.
func (f *proxyFlags) peers(o *ProxyOptions) error {
	if f.peersFile == "" {
		return nil
	}
	var err error
	if o.Peers, err = LoadPeers(f.peersFile); err != nil {
		return err
	}
	if o.Cert, err = tls.LoadX509KeyPair(f.certFile, f.keyFile); err != nil {
		return fmt.Errorf("--cert-file/--key-file: %w", err)
	}
	o.CertFile, o.KeyFile = f.certFile, f.keyFile
	return nil
}

// interfaceIP is the first global unicast address of a network interface:
// Multus attaches migration0 and crosscluster0 with the addresses kvnet's
// migration-pods webhook chose, which the downward API cannot expose.
func interfaceIP(name string) (string, error) {
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return "", err
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return "", fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
			return n.IP.String(), nil
		}
	}
	return "", fmt.Errorf("interface %s has no global unicast address", name)
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// inClusterPoolCache caches kvnet's in-cluster allocation ConfigMaps of
// namespace (kvnet's): the target side dials only the address one of them
// gives a node's virt-handler.
func inClusterPoolCache(mgr manager.Manager, namespace string) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:            mgr.GetScheme(),
		DefaultNamespaces: map[string]cache.Config{namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Label: labels.SelectorFromSet(labels.Set{migration.LabelPool: migration.PoolInCluster})},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the cache of in-cluster allocations in %s: %w", namespace, err)
	}
	if _, err := c.GetInformer(context.Background(), &corev1.ConfigMap{}); err != nil {
		return nil, fmt.Errorf("starting the informer of in-cluster allocations: %w", err)
	}
	return c, nil
}
