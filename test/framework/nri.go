package framework

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// NRIVersion is the network-resources-injector release hack/nri.sh builds.
const NRIVersion = "v1.9.0"

// NRI's names as its deployments/ ship them: it runs in kube-system as
// network-resources-injector-sa, and its installer registers
// NRIConfiguration.
const (
	NRINamespace      = "kube-system"
	NRIServiceAccount = "network-resources-injector-sa"
	NRIConfiguration  = "network-resources-injector-mutating-config"
)

// NRIDir is where make nri (hack/nri.sh) puts the webhook and the
// project's deployments/.
func NRIDir() string {
	if d := os.Getenv("KVNET_NRI_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin", "tools", "nri-"+NRIVersion)
}

// nriClient is what Start prepares, before the API server starts, for
// network-resources-injector's webhook: NRI's Deployment runs it without
// -insecure, so it requires a client certificate from the API server, and
// the API server presents one only to a webhook its admission
// configuration names by host:port. The port is reserved here and every
// StartNRI serves on it.
type nriClient struct {
	port   int
	caFile string // the CA NRI trusts for client certificates (-client-ca)
}

// webhookClientCert writes a client certificate, its CA and an admission
// configuration that makes the API server present the certificate to the
// webhook at 127.0.0.1:port, and gives kube-apiserver the flag.
func webhookClientCert(te *envtest.Environment, dir string) (*nriClient, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ca, err := newTestCert("webhook-client-ca", nil, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	cl, err := newTestCert("kube-apiserver-webhook-client", ca, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	if err != nil {
		return nil, err
	}
	caFile, _, err := ca.write(dir, "webhook-client-ca")
	if err != nil {
		return nil, err
	}
	target := "127.0.0.1:" + strconv.Itoa(port)
	kc := clientcmdapi.NewConfig()
	kc.AuthInfos[target] = &clientcmdapi.AuthInfo{ClientCertificateData: cl.certPEM, ClientKeyData: cl.keyPEM}
	kubeconfig := filepath.Join(dir, "webhook-clients.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return nil, err
	}
	admission := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: MutatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %s
`, kubeconfig)
	path := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(path, []byte(admission), 0o600); err != nil {
		return nil, err
	}
	te.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", path)
	return &nriClient{port: port, caFile: caFile}, nil
}

// NRIOptions choose how network-resources-injector runs and is registered.
type NRIOptions struct {
	// ConfigurationName names its MutatingWebhookConfiguration (default
	// NRIConfiguration). The API server calls mutating configurations in
	// the order of their names, so this decides whether it runs before
	// kvnet's ("kvnet") or after it.
	ConfigurationName string
	// WebhookName, when set, replaces the webhook's name in it (a cluster
	// that installed it under another -name prefix).
	WebhookName string
	// HonorResources passes -honor-resources: it then adds its count to a
	// resource containers[0] already has instead of skipping it.
	HonorResources bool
}

// NRI is network-resources-injector's webhook, as built by make nri,
// running against an Env's API server with its configuration registered
// by URL.
type NRI struct {
	// LogPath is its log (glog, on stderr).
	LogPath string
	// Configuration is the name of its MutatingWebhookConfiguration.
	Configuration string

	env  *Env
	proc *process
}

// StartNRI runs network-resources-injector as it runs in a cluster: its
// RBAC from its deployments/auth.yaml, its ServiceAccount's token and the
// cluster CA where rest.InClusterConfig reads them (a chroot holding only
// the static binary and those files: it reads no kubeconfig), the
// arguments of its deployments/server.yaml, and its installer's webhook
// configuration (testdata/nri-v1.9.0) pointed at its URL. It returns once
// the API server calls it (a dry-run pod on a missing NAD is refused by
// it) and kvnet's informer has the configuration. Stop ends it.
//
// It is long on purpose: it follows network-resources-injector's own
// deployment, step by step, so that each step can be checked against it.
func (e *Env) StartNRI(ctx context.Context, o NRIOptions) (_ *NRI, err error) {
	if e.nri == nil {
		return nil, errors.New("StartNRI needs an Env started with Options.NRI")
	}
	bin := filepath.Join(NRIDir(), "webhook")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("network-resources-injector %s not found at %s: run `make nri` (hack/nri.sh builds it from its Go module)", NRIVersion, bin)
	}
	if o.ConfigurationName == "" {
		o.ConfigurationName = NRIConfiguration
	}
	if err := e.applyNRIAuth(ctx); err != nil {
		return nil, fmt.Errorf("network-resources-injector's RBAC: %w", err)
	}
	dir, err := os.MkdirTemp(e.dir, "nri-")
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "root")
	sa := filepath.Join(root, "var", "run", "secrets", "kubernetes.io", "serviceaccount")
	if err := os.MkdirAll(sa, 0o700); err != nil {
		return nil, err
	}
	if err := linkOrCopy(bin, filepath.Join(root, "webhook")); err != nil {
		return nil, err
	}
	token, err := e.nriToken(ctx)
	if err != nil {
		return nil, err
	}
	for name, data := range map[string][]byte{"token": []byte(token), "ca.crt": e.Config.CAData, "namespace": []byte(NRINamespace)} {
		if err := os.WriteFile(filepath.Join(sa, name), data, 0o600); err != nil {
			return nil, err
		}
	}
	ca, err := newTestCert("network-resources-injector-ca", nil, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	serving, err := newTestCert("network-resources-injector", ca, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		return nil, err
	}
	if _, _, err := serving.write(filepath.Join(root, "etc", "tls"), "tls"); err != nil {
		return nil, err
	}
	clientCA, err := os.ReadFile(e.nri.caFile)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "tls", "client-ca.crt"), clientCA, 0o600); err != nil {
		return nil, err
	}
	health, err := freePort()
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(e.Config.Host)
	if err != nil {
		return nil, err
	}
	// deployments/server.yaml's arguments, on loopback, with the client CA
	// that signed the API server's webhook client certificate (in a
	// cluster, the default is the cluster CA).
	argv := []string{"/webhook",
		"-bind-address=127.0.0.1", "-port=" + strconv.Itoa(e.nri.port),
		"-tls-private-key-file=/etc/tls/tls.key", "-tls-cert-file=/etc/tls/tls.crt",
		"-health-check-port=" + strconv.Itoa(health), "-client-ca=/etc/tls/client-ca.crt",
		"-logtostderr",
	}
	if o.HonorResources {
		argv = append(argv, "-honor-resources")
	}
	n := &NRI{LogPath: filepath.Join(dir, "nri.log"), Configuration: o.ConfigurationName, env: e}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = []string{
		"KUBERNETES_SERVICE_HOST=" + u.Hostname(), "KUBERNETES_SERVICE_PORT=" + u.Port(),
		"NAMESPACE=" + NRINamespace,
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Setpgid: true}
	if n.proc, err = startCmd("network-resources-injector", cmd, n.LogPath); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if err := n.proc.waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", health), 30*time.Second); err != nil {
		return nil, fmt.Errorf("network-resources-injector: %w; its log:\n%s", err, n.proc.tail(30))
	}
	if err := n.register(ctx, o, ca.certPEM); err != nil {
		return nil, fmt.Errorf("registering network-resources-injector's webhook: %w; its log:\n%s", err, n.proc.tail(30))
	}
	return n, nil
}

// applyNRIAuth creates what NRI's deployments/auth.yaml ships (its
// ServiceAccount, ClusterRoles and bindings) unless it exists.
func (e *Env) applyNRIAuth(ctx context.Context) error {
	b, err := os.ReadFile(filepath.Join(NRIDir(), "deployments", "auth.yaml"))
	if err != nil {
		return err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := createIfAbsent(ctx, e.Client, &u); err != nil {
			return err
		}
	}
}

func (e *Env) nriToken(ctx context.Context) (string, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return "", err
	}
	secs := int64(tokenLifetime / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(NRINamespace).CreateToken(ctx, NRIServiceAccount, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for %s/%s: %w", NRINamespace, NRIServiceAccount, err)
	}
	return tr.Status.Token, nil
}

// register creates the configuration and waits until the API server calls
// NRI through it and kvnet's informer holds it, so that the next launcher
// pod meets both.
func (n *NRI) register(ctx context.Context, o NRIOptions, caPEM []byte) error {
	b, err := os.ReadFile(filepath.Join(RepoRoot(), "test", "framework", "testdata", "nri-"+NRIVersion, "mutating.json"))
	if err != nil {
		return err
	}
	b = bytes.ReplaceAll(b, []byte("NRI_ADDRESS"), []byte("127.0.0.1:"+strconv.Itoa(n.env.nri.port)))
	b = bytes.ReplaceAll(b, []byte("NRI_CA_BUNDLE"), []byte(base64.StdEncoding.EncodeToString(caPEM)))
	var m admissionregv1.MutatingWebhookConfiguration
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("mutating.json: %w", err)
	}
	m.Name = o.ConfigurationName
	if o.WebhookName != "" {
		m.Webhooks[0].Name = o.WebhookName
	}
	if err := n.env.Client.Create(ctx, &m); err != nil {
		return err
	}
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nri-probe", Annotations: map[string]string{
			"k8s.v1.cni.cncf.io/networks": "nri-probe-absent",
		}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.com/probe"}}},
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := n.env.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "could not find network attachment definition"), nil
	}); err != nil {
		return fmt.Errorf("the API server does not call it (a dry-run pod on a missing NAD was not refused by it): %w", err)
	}
	return n.waitKvnetSees(ctx, true)
}

// waitKvnetSees waits until kvnet's MutatingWebhookConfiguration informer
// has (or no longer has) the configuration.
func (n *NRI) waitKvnetSees(ctx context.Context, present bool) error {
	c := n.env.Manager.GetCache()
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, CacheTimeout, true, func(ctx context.Context) (bool, error) {
		var m admissionregv1.MutatingWebhookConfiguration
		err := c.Get(ctx, client.ObjectKey{Name: n.Configuration}, &m)
		return (err == nil) == present, nil
	})
}

// Stop deletes NRI's configuration (it fails closed: with NRI gone, every
// pod CREATE would be refused), waits until kvnet's informer has lost it,
// and ends the process.
func (n *NRI) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = n.env.Client.Delete(ctx, &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: n.Configuration}})
	_ = n.waitKvnetSees(ctx, false)
	if n.proc != nil {
		n.proc.stop()
	}
}

// Tail returns the last lines of NRI's log.
func (n *NRI) Tail(lines int) string { return n.proc.tail(lines) }

// linkOrCopy hard-links src to dst, or copies it across filesystems.
func linkOrCopy(src, dst string) error {
	if os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
