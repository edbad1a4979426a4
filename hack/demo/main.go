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
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/test/framework"
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
