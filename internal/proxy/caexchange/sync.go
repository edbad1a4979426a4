package caexchange

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/metrics"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// KubeVirt's CA ConfigMaps, as virt-operator v1.9.0 names them
// (pkg/virt-operator/resource/generate/components/secrets.go): it
// publishes its cluster's CA bundle in kubevirt-ca, and on every reconcile
// moves the valid certificates it finds in kubevirt-external-ca into
// kubevirt-ca, then resets kubevirt-external-ca to an empty bundle. Both
// live in KubeVirt's namespace under the key ca-bundle.
const (
	KubeVirtCAName           = "kubevirt-ca"
	ExternalCAName           = "kubevirt-external-ca"
	CABundleKey              = "ca-bundle"
	DefaultKubeVirtNamespace = "kubevirt"
	// DefaultCASyncInterval is how often each proxy offers its bundle to
	// every peer besides each change of kubevirt-ca: a rotation reaches
	// the peers within a minute even if a push was lost.
	DefaultCASyncInterval = 30 * time.Second
)

var (
	caExchanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_proxy_ca_exchanges_total",
		Help: "KubeVirt CA bundle exchanges that succeeded, by peer and direction (sent: the peer stored ours; received: we stored the peer's).",
	}, []string{"peer", "direction"})
	caFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_proxy_ca_exchange_failures_total",
		Help: "KubeVirt CA bundle exchanges that failed, by peer, direction and reason.",
	}, []string{"peer", "direction", "reason"})
	caLastSuccess = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_proxy_ca_exchange_last_success_timestamp_seconds",
		Help: "Unix time of the last successful KubeVirt CA bundle exchange, by peer and direction; 0 until the first.",
	}, []string{"peer", "direction"})
)

// RegisterMetrics registers the exchange's metrics on reg.
func RegisterMetrics(reg prometheus.Registerer) error {
	return metrics.Register(reg, caExchanges, caFailures, caLastSuccess)
}

const (
	caSent     = "sent"
	caReceived = "received"
)

func caOK(peer, direction string) {
	caExchanges.WithLabelValues(peer, direction).Inc()
	caLastSuccess.WithLabelValues(peer, direction).SetToCurrentTime()
}

func caFailed(peer, direction, reason string) {
	caFailures.WithLabelValues(peer, direction, reason).Inc()
}

// Peer is a configured peer as the exchange sees it: its name, and how
// to hand it a bundle.
type Peer struct {
	Name string
	// Offer hands the peer a PEM bundle over the hop and returns once the
	// peer stored it; a *hop.RefusedError says why it did not. Nil for a
	// peer with no address, which only offers its bundle to us.
	Offer func(ctx context.Context, bundle []byte) error
}

// CountRefusedOffer counts a peer's offer that the hop refused before it
// reached the exchange (its rate, a bundle that does not parse).
func CountRefusedOffer(peer string, why hop.RefusalCode) {
	caFailed(peer, caReceived, why.String())
}

// Sync keeps this cluster's and its peers' KubeVirt CAs in step over the
// hop: it offers the local kubevirt-ca to every peer (on each change and
// every Interval), and, as the hop listener's CAReceiver, merges what a
// peer offers into the peer's own slot of the local kubevirt-external-ca.
// It must run on the leader only (like the hop listener): two writers
// would only race for the same result.
type Sync struct {
	// Namespace is KubeVirt's, where both ConfigMaps live.
	Namespace string
	// Peers are the configured peers; the ones with an Offer are offered
	// the bundle.
	Peers []Peer
	// Interval between offers besides those on change; zero means
	// DefaultCASyncInterval.
	Interval time.Duration
	// LocalCA reads kubevirt-ca (a cache holding only it).
	LocalCA client.Reader
	// APIReader reads kubevirt-external-ca at the moment of a merge;
	// Client writes it (with the read's resourceVersion).
	APIReader client.Reader
	Client    client.Client
	// Log receives exchange events.
	Log logr.Logger

	once    sync.Once
	trigger chan struct{}
	mu      sync.Mutex
	own     map[string]bool // fingerprints seen first in the local kubevirt-ca
	recvMu  sync.Mutex
}

func (c *Sync) init() {
	c.once.Do(func() { c.trigger = make(chan struct{}, 1) })
}

// Trigger asks for an offer to every peer now (kubevirt-ca changed).
func (c *Sync) Trigger() {
	c.init()
	select {
	case c.trigger <- struct{}{}:
	default:
	}
}

// Start offers the local bundle until ctx ends (manager.Runnable).
func (c *Sync) Start(ctx context.Context) error {
	c.init()
	for _, p := range c.Peers {
		for _, d := range []string{caSent, caReceived} {
			caExchanges.WithLabelValues(p.Name, d)
			caLastSuccess.WithLabelValues(p.Name, d)
		}
	}
	interval := c.Interval
	if interval <= 0 {
		interval = DefaultCASyncInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		c.offerAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.trigger:
		}
	}
}

// LocalOffer is what this proxy offers its peers: its own cluster's
// KubeVirt CAs, not everything kubevirt-ca holds. virt-operator writes the
// current CA first and keeps behind it the previous ones (during its
// overlap) and the other clusters' CAs it took from kubevirt-external-ca.
// Handing those on would echo each peer's CAs back to it (keeping a
// rotated-out one alive) and let trust spread from peer to peer. So the
// offer is the first certificate, plus any still in the bundle that this
// proxy saw first before (the previous CAs of a rotation).
func (c *Sync) LocalOffer(ctx context.Context) ([]*x509.Certificate, error) {
	var cm corev1.ConfigMap
	if err := c.LocalCA.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: KubeVirtCAName}, &cm); err != nil {
		return nil, fmt.Errorf("reading %s/%s: %w", c.Namespace, KubeVirtCAName, err)
	}
	certs := bundleCerts(cm.Data[CABundleKey])
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s/%s holds no certificate under %s", c.Namespace, KubeVirtCAName, CABundleKey)
	}
	return c.ownOf(certs), nil
}

// ownOf picks this cluster's own CAs out of kubevirt-ca's certificates
// (see LocalOffer) and remembers the first as one of them.
func (c *Sync) ownOf(certs []*x509.Certificate) []*x509.Certificate {
	if len(certs) == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	inBundle := map[string]bool{}
	for _, cert := range certs {
		inBundle[Fingerprint(cert)] = true
	}
	if c.own == nil {
		c.own = map[string]bool{}
	}
	for fp := range c.own {
		if !inBundle[fp] {
			delete(c.own, fp) // virt-operator dropped it
		}
	}
	c.own[Fingerprint(certs[0])] = true
	var out []*x509.Certificate
	for _, cert := range certs {
		if c.own[Fingerprint(cert)] {
			out = append(out, cert)
		}
	}
	return out
}

func (c *Sync) offerAll(ctx context.Context) {
	certs, err := c.LocalOffer(ctx)
	if err != nil {
		c.Log.Error(err, "no KubeVirt CA bundle to offer the peers")
		for _, p := range c.Peers {
			if p.Offer != nil {
				caFailed(p.Name, caSent, "no-local-bundle")
			}
		}
		return
	}
	certs = offerable(certs, time.Now())
	bundle := EncodeCerts(certs)
	var wg sync.WaitGroup
	for _, p := range c.Peers {
		if p.Offer == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			log := c.Log.WithValues("peer", p.Name, "certificates", len(certs))
			if err := p.Offer(ctx, bundle); err != nil {
				reason := "unreachable"
				var ref *hop.RefusedError
				if errors.As(err, &ref) {
					reason = ref.Reason.String()
				}
				caFailed(p.Name, caSent, reason)
				log.Error(err, "offering the KubeVirt CA bundle to a peer failed", "reason", reason)
				return
			}
			caOK(p.Name, caSent)
			log.V(1).Info("the peer stored our KubeVirt CA bundle")
		}()
	}
	wg.Wait()
}

// errExternalCAMissing: kvnet does not create kubevirt-external-ca.
// virt-operator does, and the proxy's RBAC grants no create in KubeVirt's
// namespace (create cannot be limited by name).
var errExternalCAMissing = errors.New("it does not exist yet; virt-operator creates it")

// ReceiveCAs implements CAReceiver: merge peer's CAs into its slot of
// kubevirt-external-ca (see ExternalCAUpdate.Merge), with an optimistic
// lock, retried on conflict.
func (c *Sync) ReceiveCAs(ctx context.Context, peer string, certs []*x509.Certificate) error {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	configured := map[string]bool{}
	for _, p := range c.Peers {
		configured[p.Name] = true
	}
	var wrote bool
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		wrote = false
		var ext corev1.ConfigMap
		if err := c.APIReader.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: ExternalCAName}, &ext); err != nil {
			if apierrors.IsNotFound(err) {
				return errExternalCAMissing
			}
			return err
		}
		effective := map[string]bool{}
		var local corev1.ConfigMap
		if err := c.LocalCA.Get(ctx, types.NamespacedName{Namespace: c.Namespace, Name: KubeVirtCAName}, &local); err == nil {
			for _, cert := range bundleCerts(local.Data[CABundleKey]) {
				effective[Fingerprint(cert)] = true
			}
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading %s: %w", KubeVirtCAName, err)
		}
		oldAnn := ext.Annotations[AnnotationExternalCAPeers]
		data, slots := ExternalCAUpdate{
			Data: ext.Data[CABundleKey], Slots: DecodeSlots(oldAnn), Peer: peer, Want: certs,
			Effective: effective, Configured: configured,
		}.Merge()
		ann := slots.Encode()
		if data == ext.Data[CABundleKey] && ann == oldAnn {
			return nil
		}
		if ext.Data == nil {
			ext.Data = map[string]string{}
		}
		ext.Data[CABundleKey] = data
		if ann == "" {
			delete(ext.Annotations, AnnotationExternalCAPeers)
		} else {
			if ext.Annotations == nil {
				ext.Annotations = map[string]string{}
			}
			ext.Annotations[AnnotationExternalCAPeers] = ann
		}
		wrote = true
		return c.Client.Update(ctx, &ext)
	})
	if err != nil {
		reason := "write"
		if errors.Is(err, errExternalCAMissing) {
			reason = "external-ca-missing"
		}
		caFailed(peer, caReceived, reason)
		err = fmt.Errorf("storing peer %s's KubeVirt CAs in %s/%s: %w", peer, c.Namespace, ExternalCAName, err)
		c.Log.Error(err, "a peer's KubeVirt CA bundle was not stored", "peer", peer, "reason", reason)
		return err
	}
	caOK(peer, caReceived)
	if wrote {
		c.Log.Info("stored a peer's KubeVirt CAs in its slot of kubevirt-external-ca", "peer", peer, "certificates", len(certs))
	}
	return nil
}

// offerable is what of the local CAs a peer will take (ParseCABundle): the
// ones valid now, the first maxBundleCerts of them (the current CA first).
func offerable(certs []*x509.Certificate, now time.Time) []*x509.Certificate {
	var out []*x509.Certificate
	for _, c := range certs {
		if usableAt(c, now) && len(out) < maxBundleCerts {
			out = append(out, c)
		}
	}
	return out
}
