package loadtest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/webhook"
)

// Serve runs controller-runtime's webhook server (TLS, certificate watcher,
// metrics) on host:port with certificates from certDir, as `kvnet webhook`
// does, mounting the floor ("floor") or kvnet's handlers on the fixture
// ("kvnet") until ctx ends.
func Serve(ctx context.Context, mode, host string, port int, certDir string) error {
	srv := ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: host, Port: port, CertDir: certDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	})
	switch mode {
	case "floor":
		floor := Floor()
		for _, path := range Paths {
			srv.Register(path, floor)
		}
	case "kvnet":
		f, err := NewFixture()
		if err != nil {
			return err
		}
		webhook.Register(srv, f.Handlers())
	default:
		return fmt.Errorf("--serve: want floor or kvnet, got %q", mode)
	}
	return srv.Start(ctx)
}

// Paths are every path kvnet serves.
var Paths = []string{webhook.PathMutateVM, webhook.PathMutateVMI, webhook.PathValidateVM, webhook.PathValidateVMI,
	webhook.PathMutateLauncherPods, webhook.PathMutateMigrationPods, webhook.PathMutateVMIMigrationStatus}

// WriteCerts writes a CA and a serving certificate for 127.0.0.1 into dir
// (tls.crt, tls.key, ca.crt) and returns the CA bundle.
func WriteCerts(dir string) ([]byte, error) {
	now := time.Now()
	ca, err := certs.NewCA("kvnet-loadtest-ca", now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	kp, err := certs.NewServing(ca, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{"tls.crt": kp.CertPEM, "tls.key": kp.KeyPEM, "ca.crt": ca.CertPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	return ca.CertPEM, nil
}

// WaitReady polls url until it answers over TLS, or the deadline passes.
func (c *Client) WaitReady(ctx context.Context, url string, deadline time.Duration) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: c.roots, ServerName: c.ServerName}}}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w", url, deadline, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
