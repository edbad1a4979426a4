package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IPAMExtensionsCommit is the kubevirt/ipam-extensions build make peers
// unpacks (../shared/peers/README.md).
const IPAMExtensionsCommit = "edb24dec884f176498021d3c8bbfbed2f9ec76ea"

// ipam-extensions as its config/ (kustomize, config/default) deploys it at
// IPAMExtensionsCommit: namePrefix kubevirt-ipam-controller-, namespace
// kubevirt-ipam-controller-system, ServiceAccount manager.
const (
	IPAMExtensionsNamespace      = "kubevirt-ipam-controller-system"
	IPAMExtensionsServiceAccount = "kubevirt-ipam-controller-manager"
	// IPAMExtensionsConfiguration is its MutatingWebhookConfiguration and
	// IPAMExtensionsWebhook the one webhook in it.
	IPAMExtensionsConfiguration = "kubevirt-ipam-controller-mutating-webhook-configuration"
	IPAMExtensionsWebhook       = "ipam-claims.k8s.cni.cncf.io"
	// IPAMExtensionsFinalizer is the finalizer it puts on the claims it
	// creates (pkg/claims KubevirtVMFinalizer).
	IPAMExtensionsFinalizer = "kubevirt.io/persistent-ipam"
	// ipamExtensionsWebhookPort is controller-runtime's default webhook
	// port: its main.go sets none and has no flag for it.
	ipamExtensionsWebhookPort = 9443
)

// PeersDir is where make peers (hack/peers.sh) unpacks ipam-extensions
// and kubemacpool: KVNET_PEERS_DIR, else bin/tools/peers.
func PeersDir() string {
	if d := os.Getenv("KVNET_PEERS_DIR"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin", "tools", "peers")
}

// IPAMExtensions is kubevirt/ipam-extensions' manager (its VM and VMI
// controllers that create IPAMClaims, and its launcher-pod webhook that
// adds ipam-claim-reference) running against a test control plane.
type IPAMExtensions struct {
	client        client.Client
	configuration string
	proc          *process
	port          *os.File // holds portLock while it runs
	// LogPath is the process's log.
	LogPath string
}

// IPAMExtensionsOptions change how StartIPAMExtensions installs it.
type IPAMExtensionsOptions struct {
	// ConfigurationName names its MutatingWebhookConfiguration (default
	// IPAMExtensionsConfiguration). The API server calls configurations in
	// name order, so the name sets which of it and kvnet ("kvnet") comes
	// first.
	ConfigurationName string
}

// StartIPAMExtensions runs ipam-extensions as its Deployment does: under
// its own ServiceAccount with its ClusterRole (config/rbac/role.yaml),
// with its webhook configuration as config/default renders it (CREATE and
// UPDATE of pods labelled kubevirt.io=virt-launcher, failurePolicy Fail,
// reinvocationPolicy left at the API server's default, Never), registered
// by URL. Two things differ, each because the process is not in a pod: it
// runs without --leader-elect (controller-runtime finds no namespace for
// the lease outside a pod; one replica needs none), and its kubeconfig
// holds a token of its ServiceAccount. dir receives the certificates,
// kubeconfig and log. A missing binary is an error naming make peers.
//
// It is long on purpose: it follows ipam-extensions' config/ deployment,
// step by step, so that each step can be checked against it.
func StartIPAMExtensions(ctx context.Context, cfg *rest.Config, c client.Client, dir string, o IPAMExtensionsOptions) (_ *IPAMExtensions, err error) {
	if o.ConfigurationName == "" {
		o.ConfigurationName = IPAMExtensionsConfiguration
	}
	bin := filepath.Join(PeersDir(), "ipam-extensions")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("ipam-extensions (%s) not found at %s: run `make peers` (hack/peers.sh unpacks it from ../shared/peers)", IPAMExtensionsCommit[:7], bin)
	}
	lock, err := claimFixedPort(ctx, ipamExtensionsWebhookPort, "ipam-extensions'")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, o := range ipamExtensionsRBAC() {
		if err := createIfAbsent(ctx, c, o); err != nil {
			return nil, err
		}
	}
	kubeconfig, err := serviceAccountKubeconfig(ctx, cfg, IPAMExtensionsNamespace, IPAMExtensionsServiceAccount, dir)
	if err != nil {
		return nil, err
	}
	ca, serving, err := loopbackServing("ipam-extensions-test-ca", "kubevirt-ipam-controller-webhook-service")
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(dir, "certs")
	if _, _, err := serving.write(certDir, "tls"); err != nil {
		return nil, err
	}
	probe, err := freePort()
	if err != nil {
		return nil, err
	}
	ie := &IPAMExtensions{client: c, configuration: o.ConfigurationName, LogPath: filepath.Join(dir, "ipam-extensions.log"), port: lock}
	ie.proc, err = startProcess("ipam-extensions", []string{bin,
		"--certificates-dir", certDir,
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(probe),
	}, ie.LogPath, []string{"KUBECONFIG=" + kubeconfig, "LOG_LEVEL=0"})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = ie.client.Delete(context.Background(), &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ie.configuration}})
			ie.proc.stop()
		}
	}()
	if err := ie.proc.waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", probe), 60*time.Second); err != nil {
		return nil, fmt.Errorf("ipam-extensions: %w; its log:\n%s", err, ie.proc.tail(40))
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ipamExtensionsWebhookPort)), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil, nil
	}); err != nil {
		return nil, fmt.Errorf("ipam-extensions' webhook server never listened; its log:\n%s", ie.proc.tail(40))
	}
	if err := c.Create(ctx, ipamExtensionsWebhookConfiguration(o.ConfigurationName, ca.certPEM)); err != nil {
		return nil, fmt.Errorf("registering ipam-extensions' webhook: %w", err)
	}
	return ie, nil
}

// Stop removes the webhook configuration first (it fails closed on
// launcher pods), then ends the process. Its RBAC and the finalizers it
// put on claims stay, as after an uninstall that deletes its Deployment
// and webhook.
func (ie *IPAMExtensions) Stop() {
	_ = ie.client.Delete(context.Background(), &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: ie.configuration}})
	ie.proc.stop()
	ie.port.Close()
}

// Tail is the last lines of its log, for a failed test.
func (ie *IPAMExtensions) Tail(lines int) string { return ie.proc.tail(lines) }

// ipamExtensionsWebhookConfiguration is config/webhook/manifests.yaml
// after config/default's patches, pointed at the process by URL.
func ipamExtensionsWebhookConfiguration(name string, caPEM []byte) *admissionregv1.MutatingWebhookConfiguration {
	url := fmt.Sprintf("https://127.0.0.1:%d/mutate-v1-pod", ipamExtensionsWebhookPort)
	return &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "ipam-virt-workloads"}},
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name:                    IPAMExtensionsWebhook,
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig:            admissionregv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			FailurePolicy:           ptr.To(admissionregv1.Fail),
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNone),
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{"kubevirt.io": "virt-launcher"}},
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update},
				Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
			}},
		}},
	}
}

// ipamExtensionsRBAC is config/rbac's ServiceAccount, ClusterRole and
// binding (the leader-election Role is left out with --leader-elect).
func ipamExtensionsRBAC() []client.Object {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "kubevirt-ipam-controller-manager-role"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachines", "virtualmachineinstances"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachines/finalizers", "virtualmachineinstances/finalizers"}, Verbs: []string{"update"}},
			{APIGroups: []string{"k8s.cni.cncf.io"}, Resources: []string{"ipamclaims", "network-attachment-definitions"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"k8s.cni.cncf.io"}, Resources: []string{"ipamclaims"}, Verbs: []string{"create", "update"}},
		},
	}
	return []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: IPAMExtensionsNamespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: IPAMExtensionsNamespace, Name: IPAMExtensionsServiceAccount}},
		role,
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubevirt-ipam-controller-manager-rolebinding"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: IPAMExtensionsNamespace, Name: IPAMExtensionsServiceAccount}},
		},
	}
}

// serviceAccountKubeconfig writes, in dir, a kubeconfig holding a token of
// ServiceAccount namespace/sa, as a pod of that account would hold it.
func serviceAccountKubeconfig(ctx context.Context, cfg *rest.Config, namespace, sa, dir string) (string, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	secs := int64(tokenLifetime / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for %s/%s: %w", namespace, sa, err)
	}
	if tr.Status.Token == "" {
		return "", errors.New("the API server issued an empty token")
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: sa}
	kc.CurrentContext = "test"
	path := filepath.Join(dir, sa+".kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}

// claimFixedPort takes lockPort's lock of a port that peer's webhook
// server always listens on, and fails if something listens there already.
func claimFixedPort(ctx context.Context, port int, peer string) (*os.File, error) {
	lock, err := lockPort(ctx, port)
	if err != nil {
		return nil, err
	}
	if conn, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second); err == nil {
		conn.Close()
		lock.Close()
		return nil, fmt.Errorf("port %d, where %s webhook server always listens, is taken", port, peer)
	}
	return lock, nil
}

// lockPort takes an exclusive lock, shared by every test process of the
// machine, on a fixed port that a peer always listens on (ipam-extensions'
// webhook has no flag for it): go test runs test/ and test/e2e at once,
// and both start it. The lock is held until the returned file is closed
// (or the process ends), and waited for until ctx ends or five minutes
// pass.
func lockPort(ctx context.Context, port int) (*os.File, error) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("kvnet-test-port-%d.lock", port))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		switch err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.EWOULDBLOCK):
			return false, nil
		default:
			return false, err
		}
	})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("waiting for port %d, which another test process holds (%s): %w", port, path, err)
	}
	return f, nil
}
