// Package certs keeps kvnet's webhook serving certificate alive without
// cert-manager: it creates a CA and a serving certificate in one Secret,
// injects the CA bundle into kvnet's webhook configurations, renews both
// before they expire and writes the current key pair into the webhook
// server's cert dir on every replica, where controller-runtime's certwatcher
// picks it up without a restart.
//
// The Secret is the single source of truth. Replicas never coordinate other
// than through the API server's optimistic concurrency: whoever creates or
// updates the Secret first wins, the others re-read it and adopt the winner's
// material, so every replica serves a certificate the API server trusts.
package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"time"
)

// backdate is subtracted from NotBefore so that a node whose clock is a
// little behind the issuer's still accepts a certificate issued a moment ago.
const backdate = time.Hour

// KeyPair is a certificate with its private key, both parsed and as PEM.
type KeyPair struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA creates a self-signed CA valid for lifetime from now.
func NewCA(commonName string, now time.Time, lifetime time.Duration) (*KeyPair, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return issue(tmpl, nil)
}

// NewServing creates a serving certificate for dnsNames and ips signed by ca.
// It never outlives the CA: a certificate valid after its issuer expired
// would fail verification anyway, and capping it makes the CA's renewal
// re-issue it in time.
func NewServing(ca *KeyPair, dnsNames []string, ips []net.IP, now time.Time, lifetime time.Duration) (*KeyPair, error) {
	tmpl, err := servingTemplate(ca, dnsNames, ips, now, lifetime)
	if err != nil {
		return nil, err
	}
	return issue(tmpl, ca)
}

func servingTemplate(ca *KeyPair, dnsNames []string, ips []net.IP, now time.Time, lifetime time.Duration) (*x509.Certificate, error) {
	if len(dnsNames) == 0 && len(ips) == 0 {
		return nil, errors.New("a serving certificate needs at least one DNS name or IP address")
	}
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	cn := ""
	if len(dnsNames) > 0 {
		cn = dnsNames[0]
	} else {
		cn = ips[0].String()
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    dnsNames,
		IPAddresses: ips,
		NotBefore:   now.Add(-backdate),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return tmpl, nil
}

// NewPeer creates a certificate for a migration proxy signed by ca: the same
// key pair serves the proxy's hop listener and authenticates it when it
// dials a peer, so it carries both server and client use.
func NewPeer(ca *KeyPair, dnsNames []string, ips []net.IP, now time.Time, lifetime time.Duration) (*KeyPair, error) {
	tmpl, err := servingTemplate(ca, dnsNames, ips, now, lifetime)
	if err != nil {
		return nil, err
	}
	tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	return issue(tmpl, ca)
}

func issue(tmpl *x509.Certificate, parent *KeyPair) (*KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	tmpl.SerialNumber = serial
	parentCert, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		parentCert, signer = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, key.Public(), signer)
	if err != nil {
		return nil, fmt.Errorf("signing certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding key: %w", err)
	}
	return &KeyPair{
		Cert:    cert,
		Key:     key,
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// ParseKeyPair parses PEM certificate and key and checks that they belong
// together.
func ParseKeyPair(certPEM, keyPEM []byte) (*KeyPair, error) {
	certs, err := ParseCerts(certPEM)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("want exactly one certificate, found %d", len(certs))
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM block in the private key")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		if k2, err2 := x509.ParseECPrivateKey(block.Bytes); err2 == nil {
			k, err = k2, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("parsing private key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", k)
	}
	pub, ok := certs[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(signer.Public()) {
		return nil, errors.New("private key does not match the certificate")
	}
	return &KeyPair{Cert: certs[0], Key: signer, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// ParseCerts parses every CERTIFICATE block of a PEM bundle.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no certificate found")
	}
	return out, nil
}

// EncodeCerts is the PEM bundle of certs, in order.
func EncodeCerts(certs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// BundleContains reports whether the PEM bundle holds cert.
func BundleContains(bundle []byte, cert *x509.Certificate) bool {
	certs, err := ParseCerts(bundle)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(certs, func(c *x509.Certificate) bool { return c.Equal(cert) })
}

// coversNames reports whether cert is valid for exactly the wanted names.
// Extra names count as a mismatch too: a renamed Service must not keep a
// certificate for its old name forever.
func coversNames(cert *x509.Certificate, dnsNames []string, ips []net.IP) bool {
	if !sameStrings(cert.DNSNames, dnsNames) {
		return false
	}
	got := make([]string, 0, len(cert.IPAddresses))
	for _, ip := range cert.IPAddresses {
		got = append(got, ip.String())
	}
	want := make([]string, 0, len(ips))
	for _, ip := range ips {
		want = append(want, ip.String())
	}
	return sameStrings(got, want)
}

func sameStrings(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(slices.Compact(a), slices.Compact(b))
}
