// Package certstest issues throwaway certificates for tests of TLS peers
// (the migration proxy's hop, KubeVirt's migration TLS), with kvnet's own
// certs package, so a test's certificates are shaped like the ones kvnet
// issues in a cluster. It imports nothing of kvnet but certs: proxy's
// internal tests and the integration tests can both use it.
package certstest

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/kvnet/kvnet/certs"
)

// PKI is a CA and one certificate it issued for both server and client use.
type PKI struct {
	// CA is the issuing CA, key included.
	CA *certs.KeyPair
	// Cert is the leaf, ready for tls.Config.Certificates.
	Cert tls.Certificate
	// Pool trusts CA only: RootCAs or ClientCAs of the other side.
	Pool *x509.CertPool
	// CertPEM and KeyPEM are the leaf and its key as files hold them, for
	// a peer in another process.
	CertPEM, KeyPEM []byte
}

// New issues a CA named "<name>-ca" (valid for a day) and a leaf for the
// DNS name name (valid for an hour), failing the test on error.
func New(t testing.TB, name string) *PKI {
	t.Helper()
	now := time.Now()
	ca, err := certs.NewCA(name+"-ca", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := certs.NewPeer(ca, []string{name}, nil, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &PKI{CA: ca, Cert: cert, Pool: pool, CertPEM: kp.CertPEM, KeyPEM: kp.KeyPEM}
}
