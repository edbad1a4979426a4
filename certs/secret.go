package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
