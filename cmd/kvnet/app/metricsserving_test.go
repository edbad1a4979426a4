package app

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The secure setting is the zero value; plain HTTP only on loopback; every
// refusal names the flags that asked for it.
func TestMetricsServerOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		m          MetricsServing
		wantSecure bool
		wantErr    []string
	}{
		"default (the flags' zero value)": {m: MetricsServing{BindAddress: ":8080"}, wantSecure: true},
		"secure on a pod address":         {m: MetricsServing{BindAddress: "10.0.0.5:8080", CertDir: "/certs"}, wantSecure: true},
		"disabled":                        {m: MetricsServing{BindAddress: "0", Insecure: true}},
		"plain on 127.0.0.1":              {m: MetricsServing{BindAddress: "127.0.0.1:8080", Insecure: true}},
		"plain on ::1":                    {m: MetricsServing{BindAddress: "[::1]:8080", Insecure: true}},
		"plain on localhost":              {m: MetricsServing{BindAddress: "localhost:8080", Insecure: true}},
		"plain on every address": {m: MetricsServing{BindAddress: ":8080", Insecure: true},
			wantErr: []string{"--metrics-bind-address", "--metrics-secure=false", "every address", "migration networks"}},
		"plain on 0.0.0.0": {m: MetricsServing{BindAddress: "0.0.0.0:8080", Insecure: true},
			wantErr: []string{"--metrics-bind-address \"0.0.0.0:8080\"", "every address"}},
		"plain on [::]": {m: MetricsServing{BindAddress: "[::]:8080", Insecure: true},
			wantErr: []string{"every address"}},
		"plain on a pod address": {m: MetricsServing{BindAddress: "10.0.0.5:8080", Insecure: true},
			wantErr: []string{"--metrics-secure=false", "not on address 10.0.0.5"}},
		"plain on a host name": {m: MetricsServing{BindAddress: "kvnet.example:8080", Insecure: true},
			wantErr: []string{"not on address kvnet.example"}},
		"plain with a cert dir": {m: MetricsServing{BindAddress: "127.0.0.1:8080", Insecure: true, CertDir: "/certs"},
			wantErr: []string{"--metrics-cert-dir", "--metrics-secure=false"}},
		"no port": {m: MetricsServing{BindAddress: "8080"}, wantErr: []string{"--metrics-bind-address \"8080\"", "host:port"}},
	} {
		t.Run(name, func(t *testing.T) {
			minTLS13 := func(c *tls.Config) { c.MinVersion = tls.VersionTLS13 }
			o, err := tc.m.serverOptions(minTLS13)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("accepted: %+v", o)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.BindAddress != tc.m.BindAddress || o.SecureServing != tc.wantSecure || (o.FilterProvider != nil) != tc.wantSecure {
				t.Fatalf("options %+v: want bind %s, secure and filtered %v", o, tc.m.BindAddress, tc.wantSecure)
			}
			if !tc.wantSecure {
				return
			}
			if o.CertDir != tc.m.CertDir {
				t.Errorf("CertDir %q, want %q", o.CertDir, tc.m.CertDir)
			}
			var c tls.Config
			for _, f := range o.TLSOpts {
				f(&c)
			}
			if len(c.NextProtos) != 1 || c.NextProtos[0] != "http/1.1" || c.MinVersion != tls.VersionTLS13 {
				t.Errorf("TLS: NextProtos %v MinVersion %x, want http/1.1 only and the caller's minimum", c.NextProtos, c.MinVersion)
			}
		})
	}
}

// --metrics-cert-dir without its key pair is refused by name instead of
// the silent self-signed fallback.
func TestMetricsCertDirMustHoldAKeyPair(t *testing.T) {
	dir := t.TempDir()
	m := MetricsServing{BindAddress: ":8080", CertDir: dir}
	if err := m.checkCertDir(); err == nil || !strings.Contains(err.Error(), "--metrics-cert-dir "+dir) || !strings.Contains(err.Error(), "tls.crt") {
		t.Fatalf("empty dir: err = %v, want one naming --metrics-cert-dir and tls.crt", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.checkCertDir(); err == nil || !strings.Contains(err.Error(), "tls.key") {
		t.Fatalf("no key: err = %v, want one naming tls.key", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.checkCertDir(); err != nil {
		t.Fatal(err)
	}
	if err := (MetricsServing{BindAddress: ":8080"}).checkCertDir(); err != nil {
		t.Fatalf("no cert dir (self-signed): %v", err)
	}
}
