package proxy

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"

	"github.com/kvnet/kvnet/certs/certstest"
)

// writeAtomic replaces path as a mounted Secret's file changes: a whole
// new file renamed over the old one.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// eventually retries cond until it holds or a minute passes.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// handshakeAs completes a hop handshake with client's certificate and
// returns the leaf the server presented.
func handshakeAs(addr string, client tls.Certificate, serverPKI *certstest.PKI) (serial string, err error) {
	c, err := tls.Dial("tcp", addr, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{client},
		RootCAs: serverPKI.Pool, ServerName: "cluster-b"})
	if err != nil {
		return "", err
	}
	defer c.Close()
	// TLS 1.3 reports a refused client certificate on the first read; the
	// server, waiting for a preamble, answers nothing within the deadline.
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); err != nil && !strings.Contains(err.Error(), "timeout") {
		return "", err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// A peer rotates its CA: once its CA file (a mounted Secret) holds the new
// CA, its new certificates authenticate and the old CA's no longer do,
// with no restart; a broken file keeps the CAs that work.
func TestPeerCAsReloadWhenTheirFileChanges(t *testing.T) {
	self := certstest.New(t, "cluster-b")
	before, after := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-a")
	file := filepath.Join(t.TempDir(), "ca.crt")
	writeAtomic(t, file, before.CA.CertPEM)
	peer := &Peer{Name: "cluster-a", CAs: before.Pool, CAFile: file}
	ts := &TargetServer{Cert: self.Cert, Peers: []*Peer{peer}, Resolver: &staticResolver{}}
	addr, _ := hopServer(t, ts)
	ctx, cancel := context.WithCancel(context.Background())
	reloader := &CAReloader{Peers: ts.Peers, Interval: 10 * time.Millisecond, Log: logr.Discard()}
	done := make(chan struct{})
	go func() { _ = reloader.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	if _, err := handshakeAs(addr, before.Cert, self); err != nil {
		t.Fatalf("the peer's current certificate: %v", err)
	}
	if _, err := handshakeAs(addr, after.Cert, self); err == nil {
		t.Fatal("a certificate of the CA not yet in the file was accepted")
	}
	reloaded := testutil.ToFloat64(caReloads.WithLabelValues("cluster-a", "reloaded"))
	writeAtomic(t, file, after.CA.CertPEM)
	eventually(t, "the rotated CA's certificate to authenticate", func() error {
		_, err := handshakeAs(addr, after.Cert, self)
		return err
	})
	if _, err := handshakeAs(addr, before.Cert, self); err == nil {
		t.Fatal("the old CA's certificate still authenticates after the rotation")
	}
	if got := testutil.ToFloat64(caReloads.WithLabelValues("cluster-a", "reloaded")); got != reloaded+1 {
		t.Errorf("kvnet_proxy_peer_ca_reloads_total{result=reloaded} went %v -> %v, want +1", reloaded, got)
	}

	failed := testutil.ToFloat64(caReloads.WithLabelValues("cluster-a", "failed"))
	writeAtomic(t, file, []byte("not a certificate"))
	eventually(t, "the broken file to be counted", func() error {
		if testutil.ToFloat64(caReloads.WithLabelValues("cluster-a", "failed")) != failed+1 {
			return os.ErrNotExist
		}
		return nil
	})
	if _, err := handshakeAs(addr, after.Cert, self); err != nil {
		t.Fatalf("a broken CA file dropped the working CAs: %v", err)
	}
}

// The proxy's own certificate renewed on disk (cert-manager rewriting its
// Secret) serves the next handshake, through controller-runtime's
// certwatcher, with no restart.
func TestProxyCertificateReloadsFromItsFiles(t *testing.T) {
	first, second := certstest.New(t, "cluster-b"), certstest.New(t, "cluster-b")
	peerPKI := certstest.New(t, "cluster-a")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeAtomic(t, certFile, first.CertPEM)
	writeAtomic(t, keyFile, first.KeyPEM)
	cw, err := certwatcher.New(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	cw = cw.WithWatchInterval(10 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = cw.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	ts := &TargetServer{GetCert: func() (*tls.Certificate, error) { return cw.GetCertificate(nil) },
		Peers: []*Peer{{Name: "cluster-a", CAs: peerPKI.Pool}}, Resolver: &staticResolver{}}
	addr, _ := hopServer(t, ts)

	serial, err := handshakeAs(addr, peerPKI.Cert, first)
	if err != nil {
		t.Fatal(err)
	}
	if want := first.Cert.Leaf.SerialNumber.String(); serial != want {
		t.Fatalf("served serial %s, want the first certificate's %s", serial, want)
	}
	// The key first, then the certificate, as a Secret update lands.
	writeAtomic(t, keyFile, second.KeyPEM)
	writeAtomic(t, certFile, second.CertPEM)
	eventually(t, "the renewed certificate to serve", func() error {
		serial, err := handshakeAs(addr, peerPKI.Cert, second)
		if err != nil {
			return err
		}
		if want := second.Cert.Leaf.SerialNumber.String(); serial != want {
			return os.ErrNotExist
		}
		return nil
	})
}

// Two peers that one certificate name would both match are refused when
// the peers are loaded, not discovered at the first stream.
func TestCheckPeersRefusesPeersItCannotTellApart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		peers []*Peer
		want  string
	}{
		{"one name twice", []*Peer{{Name: "a"}, {Name: "a"}}, `serverName "a" is also peer a's`},
		{"a serverName that is another's name", []*Peer{{Name: "a", ServerName: "c"}, {Name: "c"}}, `peers[1] (c): serverName "c" is also peer a's`},
		{"no name", []*Peer{{Name: ""}}, "peers[0].name: empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckPeers(tc.peers)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
	if err := CheckPeers([]*Peer{{Name: "a"}, {Name: "c"}, {Name: "d", ServerName: "proxy.d.example"}}); err != nil {
		t.Fatalf("distinct peers: %v", err)
	}
}
