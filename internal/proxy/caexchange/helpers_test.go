package caexchange

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/kvnet/kvnet/certs"
)

func newCA(t testing.TB, name string) *x509.Certificate {
	t.Helper()
	ca, err := certs.NewCA(name, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca.Cert
}
