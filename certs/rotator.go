package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Keys of the Secret. tls.crt/tls.key/ca.crt follow the kubernetes.io/tls
// convention so the Secret can also be mounted by hand; the rest is ours.
const (
	KeyTLSCert   = corev1.TLSCertKey       // serving certificate
	KeyTLSKey    = corev1.TLSPrivateKeyKey // its key
	KeyCABundle  = "ca.crt"                // every CA the webhook configurations trust
	KeyCACert    = "ca-signer.crt"         // the CA that signs serving certificates
	KeyCAKey     = "ca.key"                // its key
	KeyNextCert  = "ca-next.crt"           // a CA staged for rotation: trusted, not yet signing
	KeyNextKey   = "ca-next.key"           // its key
	managedByKey = "app.kubernetes.io/managed-by"
)

// Options configure a Rotator. Zero durations take the defaults below.
type Options struct {
	// Secret holds the CA and the serving certificate.
	Secret types.NamespacedName
	// CertDir is the webhook server's cert dir; tls.crt and tls.key are
	// written there.
	CertDir string
	// DNSNames and IPAddresses the serving certificate is valid for.
	DNSNames    []string
	IPAddresses []net.IP
	// MutatingWebhooks and ValidatingWebhooks name the configurations whose
	// every webhook gets the CA bundle.
	MutatingWebhooks   []string
	ValidatingWebhooks []string
	// CALifetime (default 10 years) and CertLifetime (default 1 year).
	CALifetime   time.Duration
	CertLifetime time.Duration
	// CARenewBefore and CertRenewBefore: renew when less than this is left
	// (default a third of the lifetime).
	CARenewBefore   time.Duration
	CertRenewBefore time.Duration
	// Interval between passes (default a tenth of the shortest renew-before
	// window, at most one minute). Other replicas adopt a renewed certificate
	// within one interval, long before the old one expires.
	Interval time.Duration
}

func (o *Options) caLifetime() time.Duration {
	if o.CALifetime > 0 {
		return o.CALifetime
	}
	return 10 * 365 * 24 * time.Hour
}

func (o *Options) certLifetime() time.Duration {
	if o.CertLifetime > 0 {
		return o.CertLifetime
	}
	return 365 * 24 * time.Hour
}

func (o *Options) caRenewBefore() time.Duration {
	if o.CARenewBefore > 0 {
		return o.CARenewBefore
	}
	return o.caLifetime() / 3
}

func (o *Options) certRenewBefore() time.Duration {
	if o.CertRenewBefore > 0 {
		return o.CertRenewBefore
	}
	return o.certLifetime() / 3
}

func (o *Options) interval() time.Duration {
	if o.Interval > 0 {
		return o.Interval
	}
	return min(time.Minute, o.certRenewBefore()/10, o.caRenewBefore()/10)
}

// Validate reports options that cannot work, before anything is created.
func (o *Options) Validate() error {
	var errs []error
	if o.Secret.Name == "" || o.Secret.Namespace == "" {
		errs = append(errs, errors.New("the Secret's name and namespace are required"))
	}
	if o.CertDir == "" {
		errs = append(errs, errors.New("the cert dir is required"))
	}
	if len(o.DNSNames) == 0 && len(o.IPAddresses) == 0 {
		errs = append(errs, errors.New("at least one DNS name or IP address is required"))
	}
	if o.certRenewBefore() >= o.certLifetime() {
		errs = append(errs, fmt.Errorf("certificate renew-before %s must be shorter than its lifetime %s", o.certRenewBefore(), o.certLifetime()))
	}
	if o.caRenewBefore() >= o.caLifetime() {
		errs = append(errs, fmt.Errorf("CA renew-before %s must be shorter than its lifetime %s", o.caRenewBefore(), o.caLifetime()))
	}
	if o.certLifetime() > o.caLifetime() {
		errs = append(errs, fmt.Errorf("certificate lifetime %s must not exceed the CA lifetime %s", o.certLifetime(), o.caLifetime()))
	}
	return errors.Join(errs...)
}

// Rotator is a manager.Runnable that runs on every replica (no leader
// election: every replica must write its own cert dir).
type Rotator struct {
	client client.Client
	opts   Options
	log    logr.Logger
	// Now is the clock; tests may replace it.
	Now func() time.Time

	synced atomic.Bool
}

// New checks o and returns a Rotator. c must read from the API server, not a
// cache: the Secret and the webhook configurations are read rarely and must
// be current when deciding who won a race.
func New(c client.Client, o Options, log logr.Logger) (*Rotator, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("self-managed certificates: %w", err)
	}
	return &Rotator{client: c, opts: o, log: log, Now: time.Now}, nil
}

// NeedLeaderElection is false: every replica keeps its own cert dir current.
func (r *Rotator) NeedLeaderElection() bool { return false }

// Start runs a pass every interval until ctx ends. Errors are logged and
// counted; the next pass retries, and the certificate in use stays valid
// for at least the renew-before window.
func (r *Rotator) Start(ctx context.Context) error {
	t := time.NewTicker(r.opts.interval())
	defer t.Stop()
	r.log.Info("rotating webhook certificates", "secret", r.opts.Secret, "interval", r.opts.interval(),
		"certLifetime", r.opts.certLifetime(), "caLifetime", r.opts.caLifetime())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := r.Reconcile(ctx); err != nil {
				r.log.Error(err, "certificate pass failed; retrying next interval")
			}
		}
	}
}

// EnsureReady runs passes until the cert dir holds a key pair (the webhook
// server cannot start without one) or ctx ends. Failing to inject the CA
// bundle does not block: the configurations may not exist yet (the chart
// creates them alongside the Deployment) and later passes inject it.
func (r *Rotator) EnsureReady(ctx context.Context) error {
	backoff := 200 * time.Millisecond
	for {
		err := r.Reconcile(ctx)
		if r.synced.Load() {
			return nil
		}
		r.log.Error(err, "no serving certificate yet; retrying", "in", backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the serving certificate in Secret %s: %w (last error: %w)", r.opts.Secret, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// ReadyCheck is a readyz check: ready once this replica has written a key
// pair from the Secret into its cert dir.
func (r *Rotator) ReadyCheck(*http.Request) error {
	if !r.synced.Load() {
		return errors.New("serving certificate not written to the cert dir yet")
	}
	return nil
}

// Reconcile is one pass: settle the Secret, inject the CA bundle, write the
// cert dir.
func (r *Rotator) Reconcile(ctx context.Context) error {
	st, err := r.settleSecret(ctx)
	if err != nil {
		reconcileErrors.WithLabelValues("secret").Inc()
		return err
	}
	var errs []error
	if err := r.writeFiles(st); err != nil {
		reconcileErrors.WithLabelValues("files").Inc()
		errs = append(errs, err)
	} else {
		r.synced.Store(true)
	}
	if err := r.inject(ctx, st.bundle); err != nil {
		reconcileErrors.WithLabelValues("inject").Inc()
		errs = append(errs, err)
	}
	expiry.WithLabelValues("serving").Set(float64(st.serving.Cert.NotAfter.Unix()))
	expiry.WithLabelValues("ca").Set(float64(st.signer.Cert.NotAfter.Unix()))
	return errors.Join(errs...)
}

// state is the parsed Secret.
type state struct {
	signer  *KeyPair
	next    *KeyPair // nil unless a CA rotation is in progress
	serving *KeyPair
	bundle  []byte
}

func parseState(s *corev1.Secret) (*state, error) {
	d := s.Data
	signer, err := ParseKeyPair(d[KeyCACert], d[KeyCAKey])
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", KeyCACert, KeyCAKey, err)
	}
	serving, err := ParseKeyPair(d[KeyTLSCert], d[KeyTLSKey])
	if err != nil {
		return nil, fmt.Errorf("%s/%s: %w", KeyTLSCert, KeyTLSKey, err)
	}
	st := &state{signer: signer, serving: serving, bundle: d[KeyCABundle]}
	if len(d[KeyNextCert]) > 0 {
		if st.next, err = ParseKeyPair(d[KeyNextCert], d[KeyNextKey]); err != nil {
			return nil, fmt.Errorf("%s/%s: %w", KeyNextCert, KeyNextKey, err)
		}
	}
	if !BundleContains(st.bundle, signer.Cert) {
		return nil, fmt.Errorf("%s does not contain the signing CA", KeyCABundle)
	}
	return st, nil
}

func (st *state) encode(s *corev1.Secret) {
	s.Type = corev1.SecretTypeTLS
	s.Data = map[string][]byte{
		KeyTLSCert: st.serving.CertPEM, KeyTLSKey: st.serving.KeyPEM,
		KeyCABundle: st.bundle, KeyCACert: st.signer.CertPEM, KeyCAKey: st.signer.KeyPEM,
	}
	if st.next != nil {
		s.Data[KeyNextCert], s.Data[KeyNextKey] = st.next.CertPEM, st.next.KeyPEM
	}
}

// fresh is brand-new material: a CA and a serving certificate it signed.
func (r *Rotator) fresh(now time.Time) (*state, error) {
	ca, err := NewCA("kvnet-webhook-ca", now, r.opts.caLifetime())
	if err != nil {
		return nil, err
	}
	serving, err := NewServing(ca, r.opts.DNSNames, r.opts.IPAddresses, now, r.opts.certLifetime())
	if err != nil {
		return nil, err
	}
	return &state{signer: ca, serving: serving, bundle: ca.CertPEM}, nil
}

// settleSecret reads the Secret, creates it or moves it one step forward if
// needed, and returns what it holds afterwards. Losing a race (AlreadyExists,
// Conflict) is not an error: the winner's Secret is read again and judged
// like any other.
func (r *Rotator) settleSecret(ctx context.Context) (*state, error) {
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			return nil, fmt.Errorf("secret %s kept changing under us", r.opts.Secret)
		}
		var s corev1.Secret
		err := r.client.Get(ctx, r.opts.Secret, &s)
		if apierrors.IsNotFound(err) {
			st, err := r.fresh(r.Now())
			if err != nil {
				return nil, err
			}
			s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{
				Namespace: r.opts.Secret.Namespace, Name: r.opts.Secret.Name,
				Labels: map[string]string{managedByKey: "kvnet"},
			}}
			st.encode(&s)
			err = r.client.Create(ctx, &s)
			if apierrors.IsAlreadyExists(err) {
				r.log.V(1).Info("another replica created the certificate Secret first; adopting it")
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("creating Secret %s: %w", r.opts.Secret, err)
			}
			rotations.WithLabelValues("created").Inc()
			r.log.Info("created the webhook CA and serving certificate", "secret", r.opts.Secret,
				"servingNotAfter", st.serving.Cert.NotAfter, "caNotAfter", st.signer.Cert.NotAfter)
			return st, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading Secret %s: %w", r.opts.Secret, err)
		}
		st, parseErr := parseState(&s)
		next, reason, err := r.step(ctx, st, parseErr, s.Data[KeyCABundle])
		if err != nil {
			return nil, err
		}
		if next == nil {
			return st, nil
		}
		next.encode(&s)
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[managedByKey] = "kvnet"
		// Update carries the resourceVersion we read: if another replica
		// changed the Secret meanwhile, we get a Conflict and adopt theirs.
		err = r.client.Update(ctx, &s)
		if apierrors.IsConflict(err) {
			r.log.V(1).Info("another replica updated the certificate Secret first; adopting it", "reason", reason)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("updating Secret %s (%s): %w", r.opts.Secret, reason, err)
		}
		rotations.WithLabelValues(reason).Inc()
		r.log.Info("rotated webhook certificate material", "reason", reason, "secret", r.opts.Secret,
			"servingNotAfter", next.serving.Cert.NotAfter, "caNotAfter", next.signer.Cert.NotAfter)
		return next, nil
	}
}

// step decides the one change the Secret needs now, if any. oldBundle is
// the Secret's ca.crt as stored, used only when the rest is unusable. CA rotation
// takes two passes so that no replica ever serves a certificate the API
// server does not trust yet: first the new CA is staged (added to the
// bundle, not signing); only once every webhook configuration carries it is
// it promoted and a serving certificate issued from it.
func (r *Rotator) step(ctx context.Context, st *state, parseErr error, oldBundle []byte) (*state, string, error) {
	now := r.Now()
	if parseErr != nil {
		r.log.Error(parseErr, "certificate Secret is unusable; replacing it", "secret", r.opts.Secret)
		st, err := r.fresh(now)
		if err != nil {
			return nil, "", err
		}
		// Keep trusting the CAs of the old bundle that still parse: replicas
		// serving the old certificate keep working until they adopt the new.
		if old := pruneExpired(oldBundle, now); len(old) > 0 {
			if _, err := ParseCerts(old); err == nil {
				st.bundle = append(st.bundle, old...)
			}
		}
		return st, "invalid", nil
	}
	// Expired CAs leave the bundle whenever it is rewritten.
	bundle := pruneExpired(st.bundle, now)

	if st.next == nil && st.signer.Cert.NotAfter.Sub(now) < r.opts.caRenewBefore() {
		next, err := NewCA("kvnet-webhook-ca", now, r.opts.caLifetime())
		if err != nil {
			return nil, "", err
		}
		return &state{signer: st.signer, next: next, serving: st.serving, bundle: append(bundle, next.CertPEM...)}, "ca-staged", nil
	}
	if st.next != nil {
		trusted, err := r.trusted(ctx, st.next.Cert)
		if err != nil {
			return nil, "", err
		}
		if trusted {
			serving, err := NewServing(st.next, r.opts.DNSNames, r.opts.IPAddresses, now, r.opts.certLifetime())
			if err != nil {
				return nil, "", err
			}
			return &state{signer: st.next, serving: serving, bundle: bundle}, "ca-promoted", nil
		}
	}
	reason := ""
	switch {
	case st.serving.Cert.NotAfter.Sub(now) < r.opts.certRenewBefore() && st.signer.Cert.NotAfter.After(st.serving.Cert.NotAfter):
		// Renewing only helps while the CA outlives the certificate; after
		// that the CA rotation above re-issues it.
		reason = "serving-renewed"
	case st.serving.Cert.CheckSignatureFrom(st.signer.Cert) != nil:
		reason = "serving-reissued" // signed by a CA we no longer sign with
	case !coversNames(st.serving.Cert, r.opts.DNSNames, r.opts.IPAddresses):
		reason = "serving-reissued" // the Service or the extra names changed
	}
	if reason != "" {
		serving, err := NewServing(st.signer, r.opts.DNSNames, r.opts.IPAddresses, now, r.opts.certLifetime())
		if err != nil {
			return nil, "", err
		}
		return &state{signer: st.signer, next: st.next, serving: serving, bundle: bundle}, reason, nil
	}
	if !bytes.Equal(bundle, st.bundle) {
		return &state{signer: st.signer, next: st.next, serving: st.serving, bundle: bundle}, "ca-pruned", nil
	}
	return nil, "", nil
}

func pruneExpired(bundle []byte, now time.Time) []byte {
	certs, err := ParseCerts(bundle)
	if err != nil {
		return bundle
	}
	return EncodeCerts(slices.DeleteFunc(certs, func(c *x509.Certificate) bool { return now.After(c.NotAfter) }))
}

// trusted reports whether every webhook of every configured configuration
// already carries ca in its CA bundle. A missing configuration counts as not
// trusting: promoting then could break it the moment it is created with an
// old bundle copied from somewhere.
func (r *Rotator) trusted(ctx context.Context, ca *x509.Certificate) (bool, error) {
	ok := true
	err := r.eachConfig(ctx, func(bundles []*[]byte) bool {
		for _, b := range bundles {
			ok = ok && BundleContains(*b, ca)
		}
		return false
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return ok, err
}

// inject writes bundle into every webhook of the configured configurations.
func (r *Rotator) inject(ctx context.Context, bundle []byte) error {
	return r.eachConfig(ctx, func(bundles []*[]byte) bool {
		changed := false
		for _, b := range bundles {
			if !bytes.Equal(*b, bundle) {
				*b = bundle
				changed = true
			}
		}
		return changed
	})
}

// eachConfig reads each configuration, lets fn look at (and change) its
// webhooks' CA bundles and updates it when fn reports a change. The first
// error stops it; a Conflict is retried on the next pass.
func (r *Rotator) eachConfig(ctx context.Context, fn func(bundles []*[]byte) bool) error {
	for _, name := range r.opts.MutatingWebhooks {
		var c admissionregv1.MutatingWebhookConfiguration
		if err := r.client.Get(ctx, client.ObjectKey{Name: name}, &c); err != nil {
			return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", name, err)
		}
		var bs []*[]byte
		for i := range c.Webhooks {
			bs = append(bs, &c.Webhooks[i].ClientConfig.CABundle)
		}
		if err := r.updateIf(ctx, fn(bs), &c); err != nil {
			return err
		}
	}
	for _, name := range r.opts.ValidatingWebhooks {
		var c admissionregv1.ValidatingWebhookConfiguration
		if err := r.client.Get(ctx, client.ObjectKey{Name: name}, &c); err != nil {
			return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", name, err)
		}
		var bs []*[]byte
		for i := range c.Webhooks {
			bs = append(bs, &c.Webhooks[i].ClientConfig.CABundle)
		}
		if err := r.updateIf(ctx, fn(bs), &c); err != nil {
			return err
		}
	}
	return nil
}

func (r *Rotator) updateIf(ctx context.Context, changed bool, obj client.Object) error {
	if !changed {
		return nil
	}
	if err := r.client.Update(ctx, obj); err != nil {
		return fmt.Errorf("injecting the CA bundle into %T %s: %w", obj, obj.GetName(), err)
	}
	injections.Inc()
	r.log.Info("injected the CA bundle", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName())
	return nil
}

// writeFiles puts the serving key pair into the cert dir when it differs
// from what is there. Each file is replaced by a rename, so the certwatcher
// never reads half a file; between the two renames it may read a new
// certificate with the old key, which it rejects, keeping the old pair,
// until the key lands a moment later.
func (r *Rotator) writeFiles(st *state) error {
	if err := os.MkdirAll(r.opts.CertDir, 0o700); err != nil {
		return fmt.Errorf("creating cert dir: %w", err)
	}
	certPath := filepath.Join(r.opts.CertDir, KeyTLSCert)
	keyPath := filepath.Join(r.opts.CertDir, KeyTLSKey)
	cur, _ := os.ReadFile(certPath)
	curKey, _ := os.ReadFile(keyPath)
	if bytes.Equal(cur, st.serving.CertPEM) && bytes.Equal(curKey, st.serving.KeyPEM) {
		return nil
	}
	// Key first: a reader seeing the old certificate with the new key fails
	// just like the reverse, and the certificate's rename completes the pair.
	if err := writeAtomic(keyPath, st.serving.KeyPEM, 0o600); err != nil {
		return err
	}
	if err := writeAtomic(certPath, st.serving.CertPEM, 0o644); err != nil {
		return err
	}
	reloads.Inc()
	r.log.Info("wrote a new serving certificate to the cert dir", "dir", r.opts.CertDir,
		"notAfter", st.serving.Cert.NotAfter, "serial", st.serving.Cert.SerialNumber.String())
	return nil
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
