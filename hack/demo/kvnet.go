package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/webhook"
)

// setUpKvnet creates kvnet's namespace and its webhooks, exactly as
// webhook.Registration builds them, but called by URL and without a CA
// bundle (kvnet creates its CA and injects it: self-managed certificates),
// and starts bin/kvnet on free loopback ports. The caller stops it.
func setUpKvnet(ctx context.Context, c client.Client, o Options, kubeconfig string, say sayFunc) (*kvnetProcess, error) {
	const ns = "kvnet-system"
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	probePort, err := freePort()
	if err != nil {
		return nil, err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return nil, err
	}
	if err := registerWebhooks(ctx, c, "kvnet", fmt.Sprintf("https://127.0.0.1:%d", port), ns, o.migrationProxy); err != nil {
		return nil, err
	}
	say("==> starting kvnet (self-managed certificates, webhooks on 127.0.0.1:%d); log: %s", port, filepath.Join(o.Dir, "kvnet.log"))
	return startKvnet(o, kubeconfig, port, probePort)
}

// registerWebhooks creates kvnet's two configurations, calling base by URL;
// migrationProxy adds the migration proxy's VMI status rewrite, as the
// chart does where `kvnet proxy` runs.
func registerWebhooks(ctx context.Context, c client.Client, name, base, ns string, migrationProxy bool) error {
	// The demo's config uses every feature, so every pod webhook is registered.
	m, v := webhook.Registration{Name: name, ExcludedNamespaces: []string{"kube-system", ns}, LauncherPods: true, MigrationPods: true, MigrationProxy: migrationProxy}.Configurations()
	url := func(cc *admissionregv1.WebhookClientConfig) {
		cc.URL = ptr.To(base + *cc.Service.Path)
		cc.Service = nil
	}
	for i := range m.Webhooks {
		url(&m.Webhooks[i].ClientConfig)
	}
	for i := range v.Webhooks {
		url(&v.Webhooks[i].ClientConfig)
	}
	if err := c.Create(ctx, m); err != nil {
		return fmt.Errorf("registering the mutating webhooks: %w", err)
	}
	if err := c.Create(ctx, v); err != nil {
		return fmt.Errorf("registering the validating webhooks: %w", err)
	}
	return nil
}

// kvnetProcess is bin/kvnet running as a child in its own process group, so
// that Ctrl-C reaches the demo, which then stops kvnet in order.
type kvnetProcess struct {
	cmd       *exec.Cmd
	log       *os.File
	probePort int
	exited    chan struct{}
	err       error
}

func startKvnet(o Options, kubeconfig string, port, probePort int) (*kvnetProcess, error) {
	certDir := filepath.Join(o.Dir, "certs")
	_ = os.RemoveAll(certDir) // a new control plane means a new Secret
	return startChild(o.Kvnet, []string{"webhook",
		"--config", o.config(),
		"--namespace", "kvnet-system",
		"--cert-mode", app.CertModeSelfManaged,
		"--cert-extra-sans", "127.0.0.1",
		"--webhook-config-name", "kvnet",
		"--cert-dir", certDir,
		"--webhook-host", "127.0.0.1",
		"--webhook-port", strconv.Itoa(port),
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probePort),
		"--metrics-bind-address", "0",
	}, kubeconfig, filepath.Join(o.Dir, "kvnet.log"), probePort)
}

// startChild runs bin/kvnet with args against the cluster of kubeconfig,
// logging to logPath; probePort is where it answers health probes.
func startChild(bin string, args []string, kubeconfig, logPath string, probePort int) (*kvnetProcess, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s %s: %w", bin, args[0], err)
	}
	p := &kvnetProcess{cmd: cmd, log: logf, probePort: probePort, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *kvnetProcess) stop() {
	select {
	case <-p.exited:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	p.log.Close()
}

// waitReady polls kvnet's /readyz: TLS serving with the self-managed
// certificate and informer caches synced.
func waitReady(ctx context.Context, p *kvnetProcess) error {
	return waitProbe(ctx, p, "/readyz", "kvnet to become ready")
}

// waitProbe polls one of a child's health endpoints until it answers 200.
func waitProbe(ctx context.Context, p *kvnetProcess, path, what string) error {
	url := fmt.Sprintf("http://127.0.0.1:%d%s", p.probePort, path)
	return poll(ctx, 2*time.Minute, what, func() error {
		select {
		case <-p.exited:
			return stopPolling{fmt.Errorf("%s exited: %v (see %s)", p.cmd.Args[1], p.err, p.log.Name())}
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
}

func waitInjected(ctx context.Context, c client.Client, name string) error {
	return poll(ctx, time.Minute, "the CA bundle in the webhook configurations", func() error {
		var m admissionregv1.MutatingWebhookConfiguration
		var v admissionregv1.ValidatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &m); err != nil {
			return err
		}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
			return err
		}
		for _, w := range m.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("%s has no CA bundle yet", w.Name)
			}
		}
		for _, w := range v.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("%s has no CA bundle yet", w.Name)
			}
		}
		return nil
	})
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
