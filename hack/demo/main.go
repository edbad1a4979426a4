// Command demo is `make demo`: kvnet on a real, local control plane.
//
// It starts kube-apiserver and etcd (the binaries hack/control-plane.sh
// builds) with the CRDs kvnet works with, runs bin/kvnet as its own process
// with self-managed certificates, registers kvnet's webhooks for real (by
// URL on 127.0.0.1, since there is no Service without a cluster network),
// applies examples/ and prints, for every VM, what kvnet changed and any
// warning or refusal. Then it stops everything it started, or with --keep
// waits for Ctrl-C or `make demo-down`.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

// Options of one demo run.
type Options struct {
	// Root is the repository (examples/, bin/).
	Root string
	// Kvnet is the kvnet binary to run.
	Kvnet string
	// Dir receives the kubeconfig, kvnet's log and cert dir, and the pid file.
	Dir string
	// Keep leaves everything running until ctx ends.
	Keep bool
}

func main() {
	root := framework.RepoRoot()
	o := Options{Root: root}
	flag.StringVar(&o.Kvnet, "kvnet", filepath.Join(root, "bin", "kvnet"), "kvnet binary (make build)")
	flag.StringVar(&o.Dir, "dir", filepath.Join(root, "bin", "demo"), "working directory: kubeconfig, kvnet.log, certs, demo.pid")
	flag.BoolVar(&o.Keep, "keep", false, "keep the control plane and kvnet running until Ctrl-C or `make demo-down`")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// Run is the whole demo. It returns an error when something could not run
// or when an example did not get the outcome it is there to show (a valid
// VM refused, an invalid one admitted).
func Run(ctx context.Context, o Options, out io.Writer) (err error) {
	if _, err := os.Stat(o.Kvnet); err != nil {
		return fmt.Errorf("kvnet binary: %w (run make build)", err)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return err
	}
	pidFile := filepath.Join(o.Dir, "demo.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)

	say := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	assets, err := framework.AssetsDir()
	if err != nil {
		return err
	}
	crds, err := framework.CRDPaths()
	if err != nil {
		return err
	}
	say("==> starting kube-apiserver and etcd from %s", assets)
	te := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: true}
	cfg, err := te.Start()
	if err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() {
		say("==> stopping kube-apiserver and etcd")
		if stopErr := te.Stop(); stopErr != nil && err == nil {
			err = fmt.Errorf("stopping the control plane: %w", stopErr)
		}
	}()
	user, err := te.AddUser(envtest.User{Name: "demo-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return err
	}
	kcPath := filepath.Join(o.Dir, "kubeconfig")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return err
	}
	warnings := &warningCollector{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandlerWithContext = warnings
	c, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		return err
	}

	// kvnet's namespace and its webhooks, exactly as webhook.Registration
	// builds them, but called by URL and without a CA bundle: kvnet creates
	// its CA and injects it (self-managed certificates).
	const ns = "kvnet-system"
	port, err := freePort()
	if err != nil {
		return err
	}
	probePort, err := freePort()
	if err != nil {
		return err
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return err
	}
	if err := registerWebhooks(ctx, c, "kvnet", fmt.Sprintf("https://127.0.0.1:%d", port), ns); err != nil {
		return err
	}

	say("==> starting kvnet (self-managed certificates, webhooks on 127.0.0.1:%d); log: %s", port, filepath.Join(o.Dir, "kvnet.log"))
	kv, err := startKvnet(o, kcPath, port, probePort)
	if err != nil {
		return err
	}
	defer func() {
		say("==> stopping kvnet")
		kv.stop()
	}()
	if err := waitReady(ctx, kv, probePort); err != nil {
		return err
	}
	if err := waitInjected(ctx, c, "kvnet"); err != nil {
		return err
	}
	say("    kvnet is ready and its CA bundle is in both webhook configurations")

	// Every file of examples/ but the policy: cluster objects first
	// (namespaces, then the rest), then VMs and VMIs in file order. Files
	// named invalid*.yaml hold VMs kvnet must refuse; the others, VMs it
	// must admit. A capability that adds an example file is shown here
	// without touching the demo.
	files, err := filepath.Glob(filepath.Join(o.Root, "examples", "*.yaml"))
	if err != nil {
		return err
	}
	type vmDoc struct {
		obj       *unstructured.Unstructured
		file      string
		wantValid bool
	}
	var namespaces, others []*unstructured.Unstructured
	var vms []vmDoc
	for _, f := range files {
		if filepath.Base(f) == "config.yaml" {
			continue // kvnet's policy, given with --config
		}
		objs, err := readObjects(f)
		if err != nil {
			return err
		}
		for _, obj := range objs {
			switch obj.GetKind() {
			case "Namespace":
				namespaces = append(namespaces, obj)
			case "VirtualMachine", "VirtualMachineInstance":
				vms = append(vms, vmDoc{obj, filepath.Base(f), !strings.HasPrefix(filepath.Base(f), "invalid")})
			default:
				others = append(others, obj)
			}
		}
	}
	// VMs kvnet admits first, then the refusals.
	slices.SortStableFunc(vms, func(a, b vmDoc) int {
		switch {
		case a.wantValid == b.wantValid:
			return 0
		case a.wantValid:
			return -1
		}
		return 1
	})
	say("==> applying examples/: namespaces, the KubeVirt CR, NetworkAttachmentDefinitions")
	var nads []*unstructured.Unstructured
	for _, obj := range append(namespaces, others...) {
		if err := ensureNamespace(ctx, c, obj.GetNamespace()); err != nil {
			return err
		}
		if err := c.Create(ctx, obj); err != nil {
			if obj.GetKind() == "Namespace" && apierrors.IsAlreadyExists(err) {
				continue
			}
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), key(obj), err)
		}
		say("    created %s %s", obj.GetKind(), key(obj))
		if obj.GetKind() == "NetworkAttachmentDefinition" {
			nads = append(nads, obj)
		}
	}
	if err := waitNADsCached(ctx, c, nads); err != nil {
		return err
	}

	failures := 0
	lastFile := ""
	for _, vm := range vms {
		if vm.file != lastFile {
			say("\n==> examples/%s", vm.file)
			lastFile = vm.file
		}
		if err := ensureNamespace(ctx, c, vm.obj.GetNamespace()); err != nil {
			return err
		}
		ok, err := admit(ctx, c, warnings, vm.obj, out)
		if err != nil {
			return err
		}
		if ok != vm.wantValid {
			failures++
			fmt.Fprintf(out, "    !! expected %s to be %s\n", key(vm.obj), map[bool]string{true: "admitted", false: "refused"}[vm.wantValid])
		}
	}
	say("\n==> done: every VM above went through the real API server's admission chain into kvnet")
	if failures > 0 {
		return fmt.Errorf("%d example(s) did not get the outcome they are there to show", failures)
	}
	if o.Keep {
		say("    the control plane and kvnet keep running: KUBECONFIG=%s (kvnet log: %s)", kcPath, filepath.Join(o.Dir, "kvnet.log"))
		say("    Ctrl-C or `make demo-down` stops everything")
		select {
		case <-ctx.Done():
		case <-kv.exited:
			return fmt.Errorf("kvnet exited: %v (see %s)", kv.err, filepath.Join(o.Dir, "kvnet.log"))
		}
	}
	return nil
}

// admit creates one VM and reports what happened to it. It returns whether
// the API server admitted it.
func admit(ctx context.Context, c client.Client, w *warningCollector, obj *unstructured.Unstructured, out io.Writer) (bool, error) {
	before := obj.DeepCopy()
	w.reset()
	err := c.Create(ctx, obj)
	fmt.Fprintf(out, "\n--- %s %s: ", obj.GetKind(), key(before))
	var status apierrors.APIStatus
	switch {
	case err == nil:
	case errors.As(err, &status) && (apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err)):
		fmt.Fprintln(out, "REFUSED")
		msg := status.Status().Message
		var causes []metav1.StatusCause
		if d := status.Status().Details; d != nil {
			causes = d.Causes
		}
		if len(causes) == 0 {
			fmt.Fprintf(out, "    %s\n", msg)
		} else {
			// The message repeats the causes; print who refused, then one
			// line per field.
			who, _, _ := strings.Cut(msg, " denied the request")
			fmt.Fprintf(out, "    %s denied the request:\n", who)
			for _, cause := range causes {
				fmt.Fprintf(out, "      - %s: %s\n", cause.Field, cause.Message)
			}
		}
		printWarnings(out, w.list())
		return false, nil
	default:
		return false, fmt.Errorf("creating %s: %w", key(before), err)
	}
	var stored unstructured.Unstructured
	stored.SetGroupVersionKind(before.GroupVersionKind())
	if err := c.Get(ctx, client.ObjectKeyFromObject(before), &stored); err != nil {
		return true, err
	}
	a, b := normalize(before), normalize(&stored)
	d := diffLines(a, b, 2)
	if d == "" {
		fmt.Fprintln(out, "admitted, unchanged by kvnet")
	} else {
		fmt.Fprintln(out, "admitted; kvnet changed (- as written, + as stored):")
		fmt.Fprint(out, indent(d, "    "))
	}
	printWarnings(out, w.list())
	return true, nil
}

func printWarnings(out io.Writer, ws []string) {
	for _, w := range ws {
		fmt.Fprintf(out, "    warning: %s\n", w)
	}
}

// normalize renders an object as YAML without the fields the API server
// adds to every object, so the diff shows kvnet's changes only.
func normalize(u *unstructured.Unstructured) string {
	o := u.DeepCopy().Object
	for _, f := range []string{"managedFields", "uid", "resourceVersion", "generation", "creationTimestamp"} {
		unstructured.RemoveNestedField(o, "metadata", f)
	}
	delete(o, "status")
	y, _ := yaml.Marshal(o)
	return string(y)
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	var b strings.Builder
	for _, l := range lines {
		if l != "" {
			b.WriteString(prefix + l)
		}
	}
	return b.String()
}

func key(o client.Object) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// ensureNamespace creates ns unless it is empty or exists (the KubeVirt CR
// lives in a namespace examples/ does not declare).
func ensureNamespace(ctx context.Context, c client.Client, ns string) error {
	if ns == "" {
		return nil
	}
	err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	return nil
}

// registerWebhooks creates kvnet's two configurations, calling base by URL.
func registerWebhooks(ctx context.Context, c client.Client, name, base, ns string) error {
	// The demo's config uses every feature, so every pod webhook is registered.
	m, v := webhook.Registration{Name: name, ExcludedNamespaces: []string{"kube-system", ns}, LauncherPods: true, MigrationPods: true}.Configurations()
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
	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	err    error
}

func startKvnet(o Options, kubeconfig string, port, probePort int) (*kvnetProcess, error) {
	logf, err := os.Create(filepath.Join(o.Dir, "kvnet.log"))
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(o.Dir, "certs")
	_ = os.RemoveAll(certDir) // a new control plane means a new Secret
	cmd := exec.Command(o.Kvnet, "webhook",
		"--config", filepath.Join(o.Root, "examples", "config.yaml"),
		"--namespace", "kvnet-system",
		"--cert-mode", app.CertModeSelfManaged,
		"--cert-extra-sans", "127.0.0.1",
		"--webhook-config-name", "kvnet",
		"--cert-dir", certDir,
		"--webhook-host", "127.0.0.1",
		"--webhook-port", strconv.Itoa(port),
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probePort),
		"--metrics-bind-address", "0",
	)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting %s: %w", o.Kvnet, err)
	}
	p := &kvnetProcess{cmd: cmd, log: logf, exited: make(chan struct{})}
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
func waitReady(ctx context.Context, p *kvnetProcess, probePort int) error {
	url := fmt.Sprintf("http://127.0.0.1:%d/readyz", probePort)
	return poll(ctx, 2*time.Minute, "kvnet to become ready", func() error {
		select {
		case <-p.exited:
			return stopPolling{fmt.Errorf("kvnet exited: %v (see its log)", p.err)}
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

// waitNADsCached waits until kvnet's informers have every NAD: admission
// reads NADs from its cache, so a VM created a moment too early would be
// refused with "NAD not found". A server-side dry run of a VM asking for the
// NAD is the only view into another process' cache.
func waitNADsCached(ctx context.Context, c client.Client, nads []*unstructured.Unstructured) error {
	for _, nad := range nads {
		err := poll(ctx, 30*time.Second, "kvnet to see NAD "+key(nad), func() error {
			probe := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
				"metadata": map[string]any{
					"namespace": nad.GetNamespace(), "name": "kvnet-demo-probe",
					"annotations": map[string]any{"kvnet.io/networks": key(nad) + "@probe"},
				},
				"spec": map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{
					"domain": map[string]any{"devices": map[string]any{}, "resources": map[string]any{"requests": map[string]any{"memory": "1Gi"}}},
				}}},
			}}
			err := c.Create(ctx, probe, client.DryRunAll)
			if err != nil && strings.Contains(strings.ToLower(err.Error()), "not found") {
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// stopPolling ends poll early with its error.
type stopPolling struct{ error }

func poll(ctx context.Context, timeout time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		var stop stopPolling
		if errors.As(err, &stop) {
			return stop.error
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readObjects decodes every document of a YAML file.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// warningCollector keeps the admission warnings of the last request.
type warningCollector struct {
	mu sync.Mutex
	ws []string
}

func (w *warningCollector) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ws = append(w.ws, text)
}

func (w *warningCollector) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ws = nil
}

func (w *warningCollector) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ws...)
}
