// Command demo is `make demo`: kvnet on a real, local control plane.
//
// It starts kube-apiserver and etcd (the binaries hack/control-plane.sh
// builds) with the CRDs kvnet works with, runs bin/kvnet as its own process
// with self-managed certificates, registers kvnet's webhooks for real (by
// URL on 127.0.0.1, since there is no Service without a cluster network),
// applies examples/ and prints, for every VM, what kvnet changed and any
// warning or refusal. With KubeVirt's binaries (make kubevirt) it also runs
// virt-controller and virt-api and shows a launcher pod's claim reference, a
// virt-handler's migration0 address, a stop/start and refusals
// (mission.go). Then it stops everything it started, or with --keep waits
// for Ctrl-C or `make demo-down`. --crosscluster runs `make
// demo-crosscluster` instead (crosscluster.go).
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
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

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
	// Config is kvnet's policy file; empty means examples/config.yaml.
	Config string
	// migrationProxy registers the migration proxy's webhook (the
	// cross-cluster demo's source cluster).
	migrationProxy bool
	// KubeVirt also runs KubeVirt's own virt-controller and virt-api and
	// shows what they and kvnet do together, when `make kubevirt`'s
	// binaries are there; without them the demo says what it leaves out.
	KubeVirt bool
}

func (o Options) config() string {
	if o.Config != "" {
		return o.Config
	}
	return filepath.Join(o.Root, "examples", "config.yaml")
}

func main() {
	root := framework.RepoRoot()
	o := Options{Root: root}
	flag.StringVar(&o.Kvnet, "kvnet", filepath.Join(root, "bin", "kvnet"), "kvnet binary (make build)")
	flag.StringVar(&o.Dir, "dir", filepath.Join(root, "bin", "demo"), "working directory: kubeconfig, kvnet.log, certs, demo.pid")
	flag.BoolVar(&o.Keep, "keep", false, "keep the control plane and kvnet running until Ctrl-C or `make demo-down`")
	crossCluster := flag.Bool("crosscluster", false, "run the cross-cluster demo instead: two control planes, two `kvnet proxy`, one stream across")
	flag.BoolVar(&o.KubeVirt, "kubevirt", true, "also run KubeVirt's virt-controller and virt-api (make kubevirt) and show what they do with kvnet")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := Run
	if *crossCluster {
		run = RunCrossCluster
	}
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// Run is the whole demo. It returns an error when something could not run
// or when an example did not get the outcome it is there to show (a valid
// VM refused, an invalid one admitted). Each step has its file: the control
// plane (controlplane.go), kvnet (kvnet.go), examples/ (examples.go) and
// every VM through admission (admit.go).
//
// It is long on purpose: it is the demo's script, one block per step it
// prints, in the order the README walks through; the work of each step is
// in its file.
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

	var say sayFunc = func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	withKubeVirt := o.KubeVirt
	if withKubeVirt {
		if missing := kubeVirtMissing(); missing != nil {
			withKubeVirt = false
			say("==> %v: this run leaves out %s.", missing, whatKubeVirtShows)
			say("    `make kubevirt` gets them (from ../shared/kubevirt, or a build); kvnet's part below runs without them")
		}
	}
	kvDir := filepath.Join(o.Dir, "kubevirt")
	frontProxyDir := ""
	if withKubeVirt {
		if err := os.RemoveAll(kvDir); err != nil { // certificates of a previous run
			return err
		}
		frontProxyDir = filepath.Join(kvDir, "front-proxy")
	}
	te, err := startControlPlane(say, frontProxyDir)
	if err != nil {
		return err
	}
	defer func() {
		say("==> stopping kube-apiserver and etcd")
		if stopErr := te.Stop(); stopErr != nil && err == nil {
			err = fmt.Errorf("stopping the control plane: %w", stopErr)
		}
	}()
	c, warnings, kcPath, err := adminClient(te, o.Dir)
	if err != nil {
		return err
	}

	kv, err := setUpKvnet(ctx, c, o, kcPath, say)
	if err != nil {
		return err
	}
	defer func() {
		say("==> stopping kvnet")
		kv.stop()
	}()
	if err := waitReady(ctx, kv); err != nil {
		return err
	}
	if err := waitInjected(ctx, c, "kvnet"); err != nil {
		return err
	}
	say("    kvnet is ready and its CA bundle is in both webhook configurations")

	cluster, vms, err := readExamples(o.Root)
	if err != nil {
		return err
	}
	if withKubeVirt {
		// KubeVirt's bootstrap creates the CR, with its status; the
		// examples' CR gives it its spec.
		var cr *unstructured.Unstructured
		cluster, cr = takeKubeVirtCR(cluster)
		kv, err := startKubeVirt(ctx, te, c, kvDir, cr, say)
		if err != nil {
			return err
		}
		defer func() {
			say("==> stopping virt-api and virt-controller (virt-api's webhooks first: they fail closed)")
			kv.Stop()
		}()
	}
	if err := applyCluster(ctx, c, cluster, say); err != nil {
		return err
	}
	changers := "kvnet"
	if withKubeVirt {
		changers = "kvnet and virt-api"
	}
	failures, err := admitAll(ctx, c, warnings, vms, changers, out, say)
	if err != nil {
		return err
	}
	if withKubeVirt {
		say("\n==> done: every VM above went through the real API server's admission chain: kvnet, then virt-api")
	} else {
		say("\n==> done: every VM above went through the real API server's admission chain into kvnet")
	}
	if failures > 0 {
		return fmt.Errorf("%d example(s) did not get the outcome they are there to show", failures)
	}
	if withKubeVirt {
		if err := showMission(ctx, c, warnings, o.Root, out, say); err != nil {
			return err
		}
	}
	if !withKubeVirt {
		say("    left out: KubeVirt's steps (virt-controller, virt-api); `make kubevirt`, then `make demo` again")
	}
	if o.Keep {
		running := "the control plane and kvnet keep"
		if withKubeVirt {
			running = "the control plane, kvnet, virt-controller and virt-api keep"
		}
		say("    %s running: KUBECONFIG=%s (kvnet log: %s)", running, kcPath, filepath.Join(o.Dir, "kvnet.log"))
		say("    Ctrl-C or `make demo-down` stops everything")
		select {
		case <-ctx.Done():
		case <-kv.exited:
			return fmt.Errorf("kvnet exited: %v (see %s)", kv.err, filepath.Join(o.Dir, "kvnet.log"))
		}
	}
	return nil
}

// sayFunc prints one line of the demo's narration.
type sayFunc func(format string, a ...any)

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
