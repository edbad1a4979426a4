package app

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/kvnet/kvnet/internal/metricsauth"
)

// MetricsServing is where and how a kvnet process (`kvnet webhook`, `kvnet
// proxy`) serves /metrics. Its zero value, the flags' default, is the safe
// setting: HTTPS, and every request authenticated (TokenReview) and
// authorized (SubjectAccessReview for get on the non-resource URL /metrics)
// by the API server (internal/metricsauth, which does what controller-runtime's
// metrics filters do without linking k8s.io/apiserver). The series carry
// migration IDs, peer names and pool sizes, and in sidecar mode the proxy
// runs in KubeVirt's synchronization-controller pod, whose addresses include
// the migration networks: a plain listener on every address would give them
// to anyone on those networks.
type MetricsServing struct {
	// BindAddress is host:port, or "0" for no metrics server.
	BindAddress string
	// Insecure serves plain HTTP, with no authentication, and is accepted
	// only on a loopback address (127.0.0.1:8080, [::1]:8080,
	// localhost:8080): for a node-local agent that scrapes through the
	// pod's own loopback, never for an address another pod can reach.
	Insecure bool
	// CertDir holds tls.crt and tls.key of the HTTPS listener, reloaded when
	// they change. Empty: a self-signed certificate for localhost, made at
	// start (controller-runtime's default, as kube-controller-manager does):
	// the stream is encrypted, and the bearer token, not the certificate,
	// is what authenticates. Give a directory for a scraper that verifies
	// the server: `kvnet webhook` can name its own --cert-dir, whose
	// certificate covers the Service the metrics port is on.
	CertDir string
}

// registerMetricsFlags adds --metrics-bind-address, --metrics-secure and
// --metrics-cert-dir, the same for both commands, into the options' fields
// (ServeOptions and ProxyOptions keep MetricsAddr, MetricsInsecure and
// MetricsCertDir flat, as their other settings).
func registerMetricsFlags(fs *pflag.FlagSet, addr *string, insecure *bool, certDir *string) {
	fs.StringVar(addr, "metrics-bind-address", ":8080", "metrics address, host:port (HTTPS with the API server's authentication and authorization unless --metrics-secure=false); 0 disables")
	fs.VarPF(notBool{insecure}, "metrics-secure", "", "serve metrics over HTTPS to clients whose bearer token the API server allows get on /metrics; false serves plain HTTP with no authentication, allowed only with a loopback --metrics-bind-address").NoOptDefVal = "true"
	fs.StringVar(certDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for the metrics HTTPS listener, reloaded when they change; empty: a self-signed certificate made at start")
}

// serverOptions are controller-runtime's metrics server options for m, or
// an error naming the flag that asks for what kvnet refuses. tlsOpts apply
// to the HTTPS listener.
func (m MetricsServing) serverOptions(tlsOpts ...func(*tls.Config)) (metricsserver.Options, error) {
	if m.BindAddress == "0" {
		return metricsserver.Options{BindAddress: "0"}, nil
	}
	if m.Insecure {
		if err := loopbackOnly(m.BindAddress); err != nil {
			return metricsserver.Options{}, fmt.Errorf("--metrics-bind-address %q with --metrics-secure=false: %w", m.BindAddress, err)
		}
		if m.CertDir != "" {
			return metricsserver.Options{}, fmt.Errorf("--metrics-cert-dir %q with --metrics-secure=false: plain HTTP uses no certificate; drop one of the two", m.CertDir)
		}
		return metricsserver.Options{BindAddress: m.BindAddress}, nil
	}
	if m.BindAddress != "" {
		if _, _, err := net.SplitHostPort(m.BindAddress); err != nil {
			return metricsserver.Options{}, fmt.Errorf("--metrics-bind-address %q: want host:port, :port or 0: %w", m.BindAddress, err)
		}
	}
	return metricsserver.Options{
		BindAddress:   m.BindAddress,
		SecureServing: true,
		FilterProvider: func(c *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
			return metricsauth.Filter(c, hc)
		},
		CertDir: m.CertDir,
		// HTTP/2 stays off, as on the webhooks: its rapid-reset and stream
		// exhaustion CVEs are not worth it for one scrape every few seconds.
		TLSOpts: append([]func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}, tlsOpts...),
	}, nil
}

// checkCertDir fails when --metrics-cert-dir lacks its key pair: the
// metrics server would otherwise fall back, silently, to a self-signed
// certificate that the scraper configured to verify the given one refuses.
// Called once the certificates are in place (`kvnet webhook` writes its
// self-managed ones while the manager is built).
func (m MetricsServing) checkCertDir() error {
	if m.CertDir == "" || m.Insecure || m.BindAddress == "0" {
		return nil
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(m.CertDir, f)); err != nil {
			return fmt.Errorf("--metrics-cert-dir %s: %w", m.CertDir, err)
		}
	}
	return nil
}

// loopbackOnly accepts a host:port that only this pod can reach: a
// loopback IP or localhost. An empty host, 0.0.0.0 or :: listen on every
// address of the pod; any other name or address is reachable from outside.
func loopbackOnly(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want host:port: %w", err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	what := "address " + host
	if host == "" || net.ParseIP(host).IsUnspecified() {
		what = "every address of the pod, the migration networks' included"
	}
	return fmt.Errorf("plain HTTP metrics are allowed only on a loopback address (127.0.0.1:8080, [::1]:8080, localhost:8080), not on %s: serve them over HTTPS (the default) instead", what)
}

// notBool is a bool flag that stores its negation: --metrics-secure sets
// MetricsServing.Insecure, whose zero value is the safe one.
type notBool struct{ p *bool }

func (b notBool) String() string {
	if b.p == nil {
		return "true"
	}
	return strconv.FormatBool(!*b.p)
}

func (b notBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b.p = !v
	return nil
}

func (notBool) Type() string { return "bool" }
