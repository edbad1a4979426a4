package certs

import (
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestServingNeverOutlivesItsCA(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServing(ca, []string{"kvnet.kvnet-system.svc"}, nil, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Fatalf("serving NotAfter %s, want the CA's %s", s.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if err := s.Cert.CheckSignatureFrom(ca.Cert); err != nil {
		t.Fatalf("serving certificate not signed by the CA: %v", err)
	}
}

func TestParseKeyPairRefusesAForeignKey(t *testing.T) {
	now := time.Now()
	a, _ := NewCA("a", now, time.Hour)
	b, _ := NewCA("b", now, time.Hour)
	if _, err := ParseKeyPair(a.CertPEM, a.KeyPEM); err != nil {
		t.Fatalf("own key: %v", err)
	}
	if _, err := ParseKeyPair(a.CertPEM, b.KeyPEM); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("foreign key: err = %v, want a mismatch", err)
	}
	if _, err := ParseKeyPair(append(a.CertPEM, b.CertPEM...), a.KeyPEM); err == nil {
		t.Fatal("two certificates accepted as one key pair")
	}
}

func TestCoversNames(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA("ca", now, time.Hour)
	s, _ := NewServing(ca, []string{"a", "b"}, []net.IP{net.ParseIP("127.0.0.1")}, now, time.Hour)
	for name, tc := range map[string]struct {
		dns  []string
		ips  []net.IP
		want bool
	}{
		"same, other order": {[]string{"b", "a"}, []net.IP{net.ParseIP("127.0.0.1")}, true},
		"name added":        {[]string{"a", "b", "c"}, []net.IP{net.ParseIP("127.0.0.1")}, false},
		"name removed":      {[]string{"a"}, []net.IP{net.ParseIP("127.0.0.1")}, false},
		"IP removed":        {[]string{"a", "b"}, nil, false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := coversNames(s.Cert, tc.dns, tc.ips); got != tc.want {
				t.Fatalf("coversNames = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPruneExpiredKeepsValidCAsInOrder(t *testing.T) {
	now := time.Now()
	old, _ := NewCA("old", now.Add(-2*time.Hour), time.Hour) // expired an hour ago
	cur, _ := NewCA("cur", now, time.Hour)
	next, _ := NewCA("next", now, 2*time.Hour)
	bundle := append(append(append([]byte{}, cur.CertPEM...), old.CertPEM...), next.CertPEM...)
	got, err := ParseCerts(pruneExpired(bundle, now))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Equal(cur.Cert) || !got[1].Equal(next.Cert) {
		t.Fatalf("pruned bundle has %d certificates, want cur and next in order", len(got))
	}
}

func TestOptionsValidate(t *testing.T) {
	ok := Options{Secret: types.NamespacedName{Namespace: "ns", Name: "s"}, CertDir: "/tmp/x", DNSNames: []string{"kvnet"}}
	for name, tc := range map[string]struct {
		mutate func(*Options)
		want   string
	}{
		"defaults":                       {func(*Options) {}, ""},
		"no secret":                      {func(o *Options) { o.Secret.Name = "" }, "Secret"},
		"no names":                       {func(o *Options) { o.DNSNames = nil }, "DNS name or IP"},
		"renew before longer than life":  {func(o *Options) { o.CertLifetime, o.CertRenewBefore = time.Hour, 2*time.Hour }, "renew-before"},
		"certificate outlives CA":        {func(o *Options) { o.CALifetime, o.CertLifetime = time.Hour, 2*time.Hour }, "must not exceed"},
		"short but consistent lifetimes": {func(o *Options) { o.CALifetime, o.CertLifetime = time.Minute, 6*time.Second }, ""},
	} {
		t.Run(name, func(t *testing.T) {
			o := ok
			tc.mutate(&o)
			err := o.Validate()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if d := ok.interval(); d != time.Minute {
		t.Fatalf("default interval %s, want 1m for year-long certificates", d)
	}
}
