package framework

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
)

// KubeVirtNamespace is where virt-controller and virt-api look for the
// KubeVirt CR, their leader Lease and their service accounts: outside a pod
// (no service-account namespace file) both default to "kubevirt".
const KubeVirtNamespace = "kubevirt"

// KubeVirt's component service accounts. virt-api treats requests from these
// as KubeVirt's own (for example, only they may change a VMI's reserved
// labels or status), so each component runs as its own account here.
const (
	ControllerServiceAccount = "kubevirt-controller"
	APIServiceAccount        = "kubevirt-apiserver"
	HandlerServiceAccount    = "kubevirt-handler"
	SyncServiceAccount       = "kubevirt-synchronization-controller"
)

// LauncherImage is what virt-controller writes into virt-launcher pods; no
// kubelet runs here, so it is only a string.
const LauncherImage = "quay.io/kubevirt/virt-launcher:" + KubeVirtVersion

// KubeVirtOptions configure the real-KubeVirt tier.
type KubeVirtOptions struct {
	// Spec is the KubeVirt CR's spec (feature gates, binding plugins).
	Spec kubevirtv1.KubeVirtSpec
}

// KubeVirt is KubeVirt's own virt-controller and virt-api running against
// an Env's API server, with virt-api's webhooks registered by URL: the part
// of a real cluster that turns VMs into VMIs and virt-launcher pods and
// admits KubeVirt objects. Nodes, kubelet, virt-handler and virt-operator do
// not exist; tests that need virt-handler's writes make them with
// HandlerClient, under virt-handler's own node-bound identity.
type KubeVirt struct {
	// LogDir holds virt-controller.log and virt-api.log.
	LogDir string

	config     *rest.Config
	client     client.Client
	dir        string
	procs      []*process
	mutating   string
	validating string
	clientset  kubernetes.Interface

	mu       sync.Mutex
	handlers map[string]client.Client
}

// KubeVirtBinDir is where make kubevirt (hack/kubevirt.sh) puts the binaries.
func KubeVirtBinDir() string {
	if d := os.Getenv("KVNET_KUBEVIRT_BIN"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin", "kubevirt", KubeVirtVersion)
}

func kubeVirtBinary(name string) (string, error) {
	p := filepath.Join(KubeVirtBinDir(), name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("KubeVirt's %s %s not found at %s: run `make kubevirt` (it unpacks ../shared/kubevirt/%s or builds from KUBEVIRT_SRC)", name, KubeVirtVersion, p, KubeVirtVersion)
	}
	return p, nil
}

// FrontProxy gives kube-apiserver the request-header (front proxy) flags,
// writing their certificates to dir; call it before te.Start. kube-apiserver
// then publishes requestheader-client-ca-file in
// kube-system/extension-apiserver-authentication, without which virt-api
// panics at start. Any CA will do: nothing here uses the front proxy.
func FrontProxy(te *envtest.Environment, dir string) error {
	ca, err := newTestCert("front-proxy-ca", nil, nil, nil, nil)
	if err != nil {
		return err
	}
	client, err := newTestCert("front-proxy-client", ca, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
	if err != nil {
		return err
	}
	caFile, _, err := ca.write(dir, "front-proxy-ca")
	if err != nil {
		return err
	}
	crt, key, err := client.write(dir, "front-proxy-client")
	if err != nil {
		return err
	}
	te.ControlPlane.GetAPIServer().Configure().
		Set("requestheader-client-ca-file", caFile).
		Set("requestheader-allowed-names", "front-proxy-client").
		Set("requestheader-username-headers", "X-Remote-User").
		Set("requestheader-group-headers", "X-Remote-Group").
		Set("requestheader-extra-headers-prefix", "X-Remote-Extra-").
		Set("proxy-client-cert-file", crt).
		Set("proxy-client-key-file", key)
	return nil
}

// StartKubeVirt bootstraps what virt-operator would create, then starts
// virt-controller and virt-api against the control plane cfg reaches (as
// cluster admin, through c) and registers virt-api's webhooks. The
// kube-apiserver must have been started with FrontProxy's flags. Start does
// this for the test tiers; hack/demo calls it for its own control plane.
// dir receives the certificates, kubeconfigs and logs. On error everything
// it started is stopped again.
//
// It is long on purpose: it follows virt-operator's install, step by step,
// so that each step can be checked against it.
func StartKubeVirt(ctx context.Context, cfg *rest.Config, c client.Client, dir string, o KubeVirtOptions) (_ *KubeVirt, err error) {
	controllerBin, err := kubeVirtBinary("virt-controller")
	if err != nil {
		return nil, err
	}
	apiBin, err := kubeVirtBinary("virt-api")
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	kv := &KubeVirt{config: cfg, client: c, dir: dir, LogDir: filepath.Join(dir, "logs"), clientset: cs, handlers: map[string]client.Client{}}
	defer func() {
		if err != nil {
			kv.Stop()
		}
	}()
	for _, d := range []string{kv.LogDir, filepath.Join(dir, "tmp")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := kv.bootstrap(ctx, o.Spec); err != nil {
		return nil, fmt.Errorf("bootstrapping KubeVirt's objects: %w", err)
	}

	// Certificates live in their own directories: both binaries watch the
	// directory of each certificate and reload on any event there.
	ca, err := newTestCert("kubevirt-test-ca", nil, nil, nil, nil)
	if err != nil {
		return nil, err
	}
	serving, err := newTestCert("virt-api", ca,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		[]net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	if err != nil {
		return nil, err
	}
	apiCrt, apiKey, err := serving.write(filepath.Join(dir, "certs-api"), "tls")
	if err != nil {
		return nil, err
	}
	promCrt, promKey, err := serving.write(filepath.Join(dir, "certs-controller"), "tls")
	if err != nil {
		return nil, err
	}

	controllerKubeconfig, err := kv.serviceAccountKubeconfig(ctx, ControllerServiceAccount)
	if err != nil {
		return nil, err
	}
	apiKubeconfig, err := kv.serviceAccountKubeconfig(ctx, APIServiceAccount)
	if err != nil {
		return nil, err
	}

	if _, err := kv.start(ctx, "virt-controller", "/leader", func(port int) []string {
		return []string{controllerBin,
			"--kubeconfig", controllerKubeconfig,
			"--listen", "127.0.0.1", "--port", strconv.Itoa(port),
			"--prom-cert-file", promCrt, "--prom-key-file", promKey,
			"--launcher-image", LauncherImage,
		}
	}); err != nil {
		return nil, err
	}
	apiPort, err := kv.start(ctx, "virt-api", "/healthz", func(port int) []string {
		return []string{apiBin,
			"--kubeconfig", apiKubeconfig,
			"--listen", "127.0.0.1", "--port", strconv.Itoa(port),
			"--tls-cert-file", apiCrt, "--tls-key-file", apiKey,
			"--handler-cert-file", apiCrt, "--handler-key-file", apiKey,
		}
	})
	if err != nil {
		return nil, err
	}
	if err := kv.registerWebhooks(ctx, "127.0.0.1:"+strconv.Itoa(apiPort), ca.certPEM); err != nil {
		return nil, fmt.Errorf("registering virt-api's webhooks: %w", err)
	}
	return kv, nil
}

// bootstrap creates what virt-operator would: KubeVirt's namespace, its
// component service accounts (bound to cluster-admin, a test shortcut for
// KubeVirt's own RBAC), and the KubeVirt CR with the status both binaries
// wait for (phase Deployed; virt-api refuses every VMI without
// defaultArchitecture).
func (kv *KubeVirt) bootstrap(ctx context.Context, spec kubevirtv1.KubeVirtSpec) error {
	c := kv.client
	if err := createIfAbsent(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KubeVirtNamespace}}); err != nil {
		return err
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kvnet-test-kubevirt-components"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
	}
	for _, sa := range []string{ControllerServiceAccount, APIServiceAccount, HandlerServiceAccount, SyncServiceAccount} {
		if err := createIfAbsent(ctx, c, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: KubeVirtNamespace, Name: sa}}); err != nil {
			return err
		}
		crb.Subjects = append(crb.Subjects, rbacv1.Subject{Kind: "ServiceAccount", Namespace: KubeVirtNamespace, Name: sa})
	}
	if err := createIfAbsent(ctx, c, crb); err != nil {
		return err
	}
	cr := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: KubeVirtNamespace, Name: "kubevirt"}, Spec: spec}
	if err := c.Create(ctx, cr); err != nil {
		return fmt.Errorf("creating the KubeVirt CR: %w", err)
	}
	cr.Status = kubevirtv1.KubeVirtStatus{Phase: kubevirtv1.KubeVirtPhaseDeployed, DefaultArchitecture: "amd64"}
	if err := c.Status().Update(ctx, cr); err != nil {
		return fmt.Errorf("writing the KubeVirt CR's status: %w", err)
	}
	return nil
}

func createIfAbsent(ctx context.Context, c client.Client, obj client.Object) error {
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// tokenLifetime outlives any test run: neither binary refreshes a token
// read from a kubeconfig.
const tokenLifetime = 24 * time.Hour

// serviceAccountKubeconfig writes a kubeconfig with a token of the given
// KubeVirt service account, as the component's in-cluster config would hold.
func (kv *KubeVirt) serviceAccountKubeconfig(ctx context.Context, sa string) (string, error) {
	return serviceAccountKubeconfig(ctx, kv.config, KubeVirtNamespace, sa, kv.dir)
}

func (kv *KubeVirt) token(ctx context.Context, sa string, bound *authnv1.BoundObjectReference) (string, error) {
	secs := int64(tokenLifetime / time.Second)
	tr, err := kv.clientset.CoreV1().ServiceAccounts(KubeVirtNamespace).CreateToken(ctx, sa, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &secs, BoundObjectRef: bound},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a token for %s/%s: %w", KubeVirtNamespace, sa, err)
	}
	return tr.Status.Token, nil
}

// HandlerClient returns a client that acts as virt-handler on node: a
// token of the kubevirt-handler service account bound to a stand-in
// virt-handler pod on that node, so the API server adds the node name that
// virt-api's node restriction checks. Tests use it for the writes only
// virt-handler makes (a VMI's status once its domain runs). The Node must
// exist.
func (kv *KubeVirt) HandlerClient(ctx context.Context, node string) (client.Client, error) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	if c, ok := kv.handlers[node]; ok {
		return c, nil
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: KubeVirtNamespace, Name: "virt-handler-" + node, Labels: map[string]string{"kubevirt.io": "virt-handler"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: HandlerServiceAccount,
			NodeName:           node,
			Containers:         []corev1.Container{{Name: "virt-handler", Image: "quay.io/kubevirt/virt-handler:" + KubeVirtVersion}},
		},
	}
	if err := kv.client.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("creating the stand-in virt-handler pod on %s: %w", node, err)
	}
	token, err := kv.token(ctx, HandlerServiceAccount, &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	if err != nil {
		return nil, err
	}
	cfg := rest.AnonymousClientConfig(kv.config)
	cfg.BearerToken = token
	c, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		return nil, err
	}
	kv.handlers[node] = c
	return c, nil
}

// start runs one binary until its HTTPS readiness path answers 200. The
// binaries bind their port themselves, so a port found free may be taken
// before they bind it; start then tries again on another.
func (kv *KubeVirt) start(ctx context.Context, name, readyPath string, args func(port int) []string) (int, error) {
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return 0, err
		}
		argv := args(port)
		p, err := startProcess(name, argv, filepath.Join(kv.LogDir, name+".log"), []string{"TMPDIR=" + filepath.Join(kv.dir, "tmp")})
		if err != nil {
			return 0, err
		}
		kv.procs = append(kv.procs, p)
		url := fmt.Sprintf("https://127.0.0.1:%d%s", port, readyPath)
		if lastErr = p.waitReady(ctx, url, 60*time.Second); lastErr == nil {
			return port, nil
		}
		p.stop()
		if !strings.Contains(p.tail(50), "address already in use") {
			break
		}
	}
	return 0, fmt.Errorf("%s: %w; its log:\n%s", name, lastErr, kv.procs[len(kv.procs)-1].tail(40))
}

// handedOut are the ports freePort has returned in this process: the
// kernel may give a port just closed to the next listen on :0, so two
// calls in a row (a webhook port, then a metrics port) could return the
// same one, and the second server would fail to bind.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

func freePort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port, nil
		}
	}
	return 0, errors.New("no loopback port that this process has not handed out already")
}

// registerWebhooks creates virt-api's two configurations exactly as
// virt-operator builds them, pointed at virt-api's URL, and waits until the
// API server calls them: a VM that virt-api refuses is dry-run until it is
// refused by virt-api.
func (kv *KubeVirt) registerWebhooks(ctx context.Context, addr string, caPEM []byte) error {
	dir := filepath.Join(RepoRoot(), "test", "framework", "testdata", "virt-api-"+KubeVirtVersion)
	fill := func(file string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return nil, err
		}
		b = bytes.ReplaceAll(b, []byte("VIRT_API_ADDRESS"), []byte(addr))
		return bytes.ReplaceAll(b, []byte("VIRT_API_CA_BUNDLE"), []byte(base64.StdEncoding.EncodeToString(caPEM))), nil
	}
	b, err := fill("mutating.json")
	if err != nil {
		return err
	}
	var m admissionregv1.MutatingWebhookConfiguration
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("mutating.json: %w", err)
	}
	if b, err = fill("validating.json"); err != nil {
		return err
	}
	var v admissionregv1.ValidatingWebhookConfiguration
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("validating.json: %w", err)
	}
	if err := kv.client.Create(ctx, &m); err != nil {
		return err
	}
	kv.mutating = m.Name
	if err := kv.client.Create(ctx, &v); err != nil {
		return err
	}
	kv.validating = v.Name

	probe := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: KubeVirtNamespace, Name: "virt-api-probe"},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyHalted),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: kubevirtv1.VirtualMachineInstanceSpec{
				Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Interfaces: []kubevirtv1.Interface{{
					Name:                   "default",
					InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Bridge: &kubevirtv1.InterfaceBridge{}},
					Binding:                &kubevirtv1.PluginBinding{Name: "probe"},
				}}}},
				Networks: []kubevirtv1.Network{*kubevirtv1.DefaultPodNetwork()},
			}},
		},
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		err := kv.client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		return err != nil && strings.Contains(err.Error(), "virtualmachine-validator.kubevirt.io"), nil
	})
}

// Stop removes virt-api's webhook configurations first (they fail closed:
// with virt-api gone, every VM write and pod eviction would be refused) and
// then ends both processes.
func (kv *KubeVirt) Stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if kv.mutating != "" {
		_ = kv.client.Delete(ctx, &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: kv.mutating}})
	}
	if kv.validating != "" {
		_ = kv.client.Delete(ctx, &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: kv.validating}})
	}
	for _, p := range kv.procs {
		p.stop()
	}
}

// LogTails returns the last lines of each component's log, for a failed run.
func (kv *KubeVirt) LogTails(lines int) string {
	var b strings.Builder
	for _, p := range kv.procs {
		fmt.Fprintf(&b, "----- %s (%s), last %d lines -----\n%s\n", p.name, p.logPath, lines, p.tail(lines))
	}
	return b.String()
}

// process is one KubeVirt binary with its log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	log     *os.File
	exited  chan struct{}
	err     error
}

func startProcess(name string, argv []string, logPath string, env []string) (*process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so that a ^C to the test reaches it through
	// Stop and not halfway through a request.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return startCmd(name, cmd, logPath)
}

// startCmd starts cmd with its output in logPath; cmd.SysProcAttr must
// set Setpgid (stop kills the group).
func startCmd(name string, cmd *exec.Cmd, logPath string) (*process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, log: log, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// waitReady polls url (self-signed TLS) until it answers 200, the process
// exits, or the timeout passes.
func (p *process) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a local test process's self-signed endpoint
	defer hc.CloseIdleConnections()
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.exited:
			return false, fmt.Errorf("exited before it was ready: %v", p.err)
		default:
		}
		resp, err := hc.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// stop kills the process (both binaries keep no state worth a graceful
// shutdown; virt-api would wait 5 s for its drain) and waits for it.
func (p *process) stop() {
	select {
	case <-p.exited:
	default:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
	p.log.Close()
}

func (p *process) tail(lines int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
