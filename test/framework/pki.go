package framework

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// testCert is a certificate and key for the test control plane's own
// components (virt-api, virt-controller, the API server's front proxy).
// RSA 2048, as KubeVirt's own certificates: kvnet's certs package issues
// ECDSA, which virt-api was not verified with.
type testCert struct {
	cert    *x509.Certificate
	key     *rsa.PrivateKey
	certPEM []byte
	keyPEM  []byte
}

// newTestCert issues a certificate; a nil parent makes it a self-signed CA.
func newTestCert(cn string, parent *testCert, usages []x509.ExtKeyUsage, ips []net.IP, dns []string) (*testCert, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generating key for %s: %w", cn, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usages,
		IPAddresses:  ips,
		DNSNames:     dns,
	}
	signerCert, signerKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	} else {
		signerCert, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signerCert, &key.PublicKey, signerKey)
	if err != nil {
		return nil, fmt.Errorf("signing %s: %w", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &testCert{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}),
	}, nil
}

// write stores the pair as <dir>/<name>.crt and .key and returns both paths.
func (c *testCert) write(dir, name string) (crt, key string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	crt, key = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(crt, c.certPEM, 0o600); err != nil {
		return "", "", err
	}
	return crt, key, os.WriteFile(key, c.keyPEM, 0o600)
}

// loopbackServing issues a CA named caCN and, signed by it, a serving
// certificate named cn for 127.0.0.1 and localhost: what a peer's webhook
// server, registered by URL, serves the API server.
func loopbackServing(caCN, cn string) (ca, serving *testCert, err error) {
	if ca, err = newTestCert(caCN, nil, nil, nil, nil); err != nil {
		return nil, nil, err
	}
	serving, err = newTestCert(cn, ca, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	return ca, serving, err
}
