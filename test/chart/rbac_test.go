package chart

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/test/framework"
)

// kvnet, started with exactly the arguments the chart's Deployment gives it
// and authenticated as the chart's ServiceAccount (by impersonation, on an
// API server that enforces RBAC), becomes ready: its informers sync, it
// creates its Secret, injects the CA into both webhook configurations and
// wins the leader Lease. A verb missing from the chart's RBAC fails here,
// not in a customer's cluster. kvnet runs as its own process, as in a pod.
func TestChartRBACIsEnoughToRunKvnet(t *testing.T) {
	kvnet := buildKvnet(t)
	for name, c := range map[string]chartCase{
		"defaults": {release: "rbac", namespace: "rbac-system"},
		"migration networks and policy on": {release: "rbac-mig", namespace: "rbac-mig", values: `
config:
  networkRules:
    - {name: storage, networks: [{name: storage, nad: storage}]}
  migration:
    inCluster:
      nad: kubevirt/migration
      pool: {cidr: 10.10.0.0/24}
`},
	} {
		t.Run(name, func(t *testing.T) { runAsChartServiceAccount(t, kvnet, c) })
	}
}

// chartKvnet is a kvnet webhook started by startChartKvnet.
type chartKvnet struct {
	*process
	fullname string
	// cm is the chart's ConfigMap; cfgPath the file kvnet reads it from.
	cm      corev1.ConfigMap
	cfgPath string
	// metricsAddr, pprofAddr and webhookPort are where it listens on
	// 127.0.0.1.
	metricsAddr, pprofAddr string
	webhookPort            int
}

// startChartKvnet installs chart case c, starts kvnet with exactly the
// arguments the chart's Deployment gives it, as the chart's
// ServiceAccount, and waits until it is ready, has injected its CA into
// both webhook configurations and holds the leader Lease.
func startChartKvnet(t *testing.T, kvnet string, c chartCase) *chartKvnet {
	t.Helper()
	ctx := t.Context()
	objs := render(t, c)
	install(t, c, objs)
	fullname := c.release + "-kvnet"
	if strings.Contains(c.release, "kvnet") {
		fullname = c.release
	}

	var dep appsv1.Deployment
	decodeKind(t, objs, "Deployment", &dep)
	var cm corev1.ConfigMap
	decodeKind(t, objs, "ConfigMap", &cm)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	probe := framework.FreePort(t)
	args := append([]string{}, dep.Spec.Template.Spec.Containers[0].Args...)
	// The chart serves the metrics with the webhooks' certificate, which its
	// ServiceMonitor verifies.
	certDir, _ := argValue(args, "cert-dir")
	if metricsCertDir, ok := argValue(args, "metrics-cert-dir"); !ok || metricsCertDir != certDir {
		t.Fatalf("the chart's --metrics-cert-dir %q (given %v), want its --cert-dir %q", metricsCertDir, ok, certDir)
	}
	if secure, ok := argValue(args, "metrics-secure"); ok && secure != "true" {
		t.Fatalf("the chart turns metrics authentication off: --metrics-secure=%s", secure)
	}
	metricsAddr := hostPort(t, "127.0.0.1")
	pprofAddr := hostPort(t, "127.0.0.1")
	webhookPort := framework.FreePort(t)
	// Only where things live on this machine changes; later flags win.
	args = append(args,
		"--config="+cfgPath, "--cert-dir="+filepath.Join(dir, "certs"), "--metrics-cert-dir="+filepath.Join(dir, "certs"),
		fmt.Sprintf("--webhook-port=%d", webhookPort), "--webhook-host=127.0.0.1",
		"--metrics-bind-address="+metricsAddr, fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe),
		"--pprof-bind-address="+pprofAddr,
	)
	sa := dep.Spec.Template.Spec.ServiceAccountName
	p := startAs(t, kvnet, args, c.namespace, "system:serviceaccount:"+c.namespace+":"+sa,
		"system:serviceaccounts", "system:serviceaccounts:"+c.namespace, "system:authenticated")
	done, waitErr := p.done, &p.err

	url := fmt.Sprintf("http://127.0.0.1:%d/readyz?verbose", probe)
	wait(t, "kvnet to become ready as the chart's ServiceAccount", 2*time.Minute, done, waitErr, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("/readyz: %s: %s", resp.Status, body)
		}
		return nil
	})
	wait(t, "the CA bundle in both webhook configurations", time.Minute, done, waitErr, func() error {
		var m admissionregv1.MutatingWebhookConfiguration
		var v admissionregv1.ValidatingWebhookConfiguration
		if err := cl.Get(ctx, client.ObjectKey{Name: fullname}, &m); err != nil {
			return err
		}
		if err := cl.Get(ctx, client.ObjectKey{Name: fullname}, &v); err != nil {
			return err
		}
		for _, w := range m.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("%s has no CA bundle", w.Name)
			}
		}
		for _, w := range v.Webhooks {
			if len(w.ClientConfig.CABundle) == 0 {
				return fmt.Errorf("%s has no CA bundle", w.Name)
			}
		}
		return nil
	})
	wait(t, "the leader Lease", time.Minute, done, waitErr, func() error {
		var l coordinationv1.Lease
		if err := cl.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: fullname}, &l); err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return fmt.Errorf("lease has no holder")
		}
		return nil
	})
	return &chartKvnet{process: p, fullname: fullname, cm: cm, cfgPath: cfgPath,
		metricsAddr: metricsAddr, pprofAddr: pprofAddr, webhookPort: webhookPort}
}

func runAsChartServiceAccount(t *testing.T, kvnet string, c chartCase) {
	ctx := t.Context()
	k := startChartKvnet(t, kvnet, c)
	fullname, cm, cfgPath, metricsAddr := k.fullname, k.cm, k.cfgPath, k.metricsAddr
	logs, done, waitErr := k.logs, k.done, &k.err
	checkIdleFootprint(t, k.pid, k.pprofAddr)
	var secret corev1.Secret
	if err := cl.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: fullname + "-webhook-cert"}, &secret); err != nil {
		t.Fatalf("kvnet's Secret: %v", err)
	}
	// Its metrics, as the chart's ServiceMonitor scrapes them: HTTPS,
	// verified for the Service's name with the Secret's ca.crt, and a
	// token the API server reviews with the TokenReview and
	// SubjectAccessReview the chart's RBAC lets kvnet create.
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(secret.Data["ca.crt"]) {
		t.Fatalf("kvnet's Secret has no ca.crt")
	}
	newScrapers(t, c.namespace, fullname).check(t, metricsAddr,
		&tls.Config{RootCAs: pool, ServerName: fullname + "." + c.namespace + ".svc", MinVersion: tls.VersionTLS12}, "kvnet_config_last_reload_successful")
	// The config alone turns persistent IPs off (an edited ConfigMap, no
	// helm upgrade): the leader takes the fail-closed launcher-pods webhook
	// out of the chart's configuration, with the chart's RBAC.
	var before admissionregv1.MutatingWebhookConfiguration
	if err := cl.Get(ctx, client.ObjectKey{Name: fullname}, &before); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(before.Webhooks, func(w admissionregv1.MutatingWebhook) bool { return w.Name == "launcher-pods.mutate.kvnet.io" }) {
		t.Fatalf("the chart's defaults render no launcher-pods webhook to remove")
	}
	var cfgDoc map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &cfgDoc); err != nil {
		t.Fatal(err)
	}
	if cfgDoc == nil {
		cfgDoc = map[string]any{}
	}
	cfgDoc["persistentIPs"] = map[string]any{"enabled": false}
	cfgDoc["resources"] = map[string]any{"inject": "never"}
	edited, err := yaml.Marshal(cfgDoc)
	if err != nil {
		t.Fatal(err)
	}
	// Replaced in one rename, as the kubelet swaps a ConfigMap volume.
	if err := os.WriteFile(cfgPath+".new", edited, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(cfgPath+".new", cfgPath); err != nil {
		t.Fatal(err)
	}
	wait(t, "the launcher-pods webhook removed after the config turned persistent IPs off", time.Minute, done, waitErr, func() error {
		var m admissionregv1.MutatingWebhookConfiguration
		if err := cl.Get(ctx, client.ObjectKey{Name: fullname}, &m); err != nil {
			return err
		}
		for _, w := range m.Webhooks {
			if w.Name == "launcher-pods.mutate.kvnet.io" {
				return fmt.Errorf("still registered")
			}
		}
		return nil
	})
	if strings.Contains(logs.String(), "forbidden") {
		t.Errorf("kvnet was refused a request (RBAC):\n%s", grepLines(logs.String(), "forbidden"))
	}
}

func buildKvnet(t *testing.T) string {
	t.Helper()
	kvnet := filepath.Join(t.TempDir(), "kvnet")
	build := exec.Command("go", "build", "-o", kvnet, "./cmd/kvnet")
	build.Dir = framework.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kvnet: %v\n%s", err, out)
	}
	return kvnet
}

// process is a kvnet process a test started: its output, a channel closed
// when it exits, and then its exit status.
type process struct {
	logs *bytes.Buffer
	done chan struct{}
	err  error
	pid  int
}

// startAs runs kvnet with args as user (by impersonation) with
// POD_NAMESPACE podNamespace, as in a pod; it is stopped at cleanup, and
// its log printed if the test failed.
func startAs(t *testing.T, kvnet string, args []string, podNamespace, user string, groups ...string) *process {
	t.Helper()
	p := &process{logs: &bytes.Buffer{}, done: make(chan struct{})}
	cmd := exec.Command(kvnet, args...)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	cmd.Env = append(os.Environ(), "POD_NAMESPACE="+podNamespace, "KUBECONFIG="+impersonatingKubeconfig(t, user, groups...))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.pid = cmd.Process.Pid
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("kvnet %s's log:\n%s", args[0], p.logs.String())
		}
	})
	return p
}

func grepLines(s, word string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, word) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// impersonatingKubeconfig is an admin kubeconfig for the test API server
// that acts as user with groups: RBAC decides as it would for that user.
func impersonatingKubeconfig(t *testing.T, user string, groups ...string) string {
	t.Helper()
	admin, err := testEnv.AddUser(envtest.User{Name: "chart-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate, ai.ImpersonateGroups = user, groups
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// wait polls cond until it holds, kvnet exits, or the deadline (which only
// turns a hang into a message) passes.
func wait(t *testing.T, what string, deadline time.Duration, exited <-chan struct{}, exitErr *error, cond func() error) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-exited:
			t.Fatalf("kvnet exited while waiting for %s: %v", what, *exitErr)
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Sidecar mode: `kvnet proxy`, started with exactly the arguments of the
// container kvnet's webhook injects (from the rendered config), as the
// synchronization controller's ServiceAccount, syncs its caches and wins
// the proxy's Lease in kvnet's namespace with the chart's RBAC alone; while
// that Lease (the chart's) is missing it says so by name, and takes it once
// it is back. The same RBAC lets that ServiceAccount write the mappings
// ConfigMap, the one
// object the status rewrite trusts, and nobody else but kvnet itself: not
// virt-handler, not virt-controller, not a user; nor may the sync
// controller's ServiceAccount touch kvnet's other Lease or ConfigMaps by
// name.
func TestChartRBACIsEnoughToRunTheProxySidecar(t *testing.T) {
	ctx := t.Context()
	c := chartCase{release: "kvnet", namespace: "rbac-sidecar", values: `
migrationProxy: {enabled: true, sidecar: {namespace: rbac-kubevirt}}
config:
  migration:
    inCluster: {nad: rbac-kubevirt/migration, pool: {cidr: 10.10.0.0/24}}
    crossCluster: {nad: rbac-kubevirt/crosscluster, addresses: [10.20.0.10/24, 10.20.0.11/24]}
`}
	objs := render(t, c)
	install(t, c, objs)
	for _, o := range objs {
		if o.GetKind() == "Deployment" && strings.Contains(o.GetName(), "migration-proxy") {
			t.Fatalf("sidecar mode rendered a proxy Deployment %s", o.GetName())
		}
	}
	var cm corev1.ConfigMap
	decodeKind(t, objs, "ConfigMap", &cm)
	cfg, err := config.Parse([]byte(cm.Data["config.yaml"]), c.namespace)
	if err != nil {
		t.Fatal(err)
	}
	ps := cfg.Migration.ProxySidecar
	if ps == nil || !ps.Enabled || ps.Container.Name != "kvnet-proxy" {
		t.Fatalf("the rendered config has no proxy sidecar: %+v", ps)
	}
	sa := "system:serviceaccount:rbac-kubevirt:kubevirt-synchronization-controller"

	kvnet := buildKvnet(t)
	// The chart's metrics listener is on every address of the pod (the
	// migration networks' too) and authenticated: not turned off.
	if addr, _ := argValue(ps.Container.Args, "metrics-bind-address"); !strings.HasPrefix(addr, ":") {
		t.Fatalf("the sidecar's --metrics-bind-address %q: want the chart's every-address :port", addr)
	}
	if secure, ok := argValue(ps.Container.Args, "metrics-secure"); ok && secure != "true" {
		t.Fatalf("the chart turns the sidecar's metrics authentication off: --metrics-secure=%s", secure)
	}
	metricsPort := framework.FreePort(t)
	// Only what this machine lacks changes (no migration0 here, and the
	// port of a shared machine); later flags win.
	args := append(append([]string{}, ps.Container.Args...), "--advertise-address=127.0.0.1",
		fmt.Sprintf("--metrics-bind-address=:%d", metricsPort), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", framework.FreePort(t)))
	// Without the chart's Lease (as if deleted by hand) the proxy, which
	// may not create one, names it in its log until it is back (as the next
	// helm upgrade would restore it).
	leaseKey := client.ObjectKey{Namespace: c.namespace, Name: "kvnet-migration-proxy"}
	var chartLease coordinationv1.Lease
	if err := cl.Get(ctx, leaseKey, &chartLease); err != nil {
		t.Fatalf("the chart's proxy Lease: %v", err)
	}
	if err := cl.Delete(ctx, &chartLease); err != nil {
		t.Fatal(err)
	}
	// POD_NAMESPACE is KubeVirt's, as in the sync controller's pod: the
	// container's own --namespace must point it at kvnet's.
	p := startAs(t, kvnet, args, "rbac-kubevirt", sa, "system:serviceaccounts", "system:serviceaccounts:rbac-kubevirt", "system:authenticated")
	logs, done, waitErr := p.logs, p.done, &p.err
	missing := "Lease " + leaseKey.String() + " does not exist"
	wait(t, "the proxy to name its missing Lease", time.Minute, done, waitErr, func() error {
		if !strings.Contains(logs.String(), missing) {
			return fmt.Errorf("no %q in the log yet", missing)
		}
		return nil
	})
	chartLease.ResourceVersion, chartLease.UID = "", ""
	if err := cl.Create(ctx, &chartLease); err != nil {
		t.Fatal(err)
	}
	wait(t, "the proxy's Lease in kvnet's namespace", time.Minute, done, waitErr, func() error {
		var l coordinationv1.Lease
		if err := cl.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: "kvnet-migration-proxy"}, &l); err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return fmt.Errorf("lease has no holder")
		}
		return nil
	})
	wait(t, "the proxy's controller to start (its caches synced)", time.Minute, done, waitErr, func() error {
		if !strings.Contains(logs.String(), "Starting workers") {
			return fmt.Errorf("no \"Starting workers\" yet")
		}
		return nil
	})
	// Reached through a non-loopback address, as from a migration
	// network: HTTPS only (a certificate of its own, self-signed), and
	// only for a token the API server lets get /metrics, which it asks as
	// the sync controller's ServiceAccount with the chart's RBAC.
	metricsAddr := net.JoinHostPort(nonLoopbackAddr(t), fmt.Sprint(metricsPort))
	waitListening(t, p, metricsAddr)
	newScrapers(t, c.namespace, "kvnet").check(t, metricsAddr,
		&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, "kvnet_proxy_active_connections") //nolint:gosec // self-signed: the token, reviewed by the API server, is what authenticates
	if strings.Contains(logs.String(), "forbidden") {
		t.Errorf("kvnet proxy was refused a request (RBAC):\n%s", grepLines(logs.String(), "forbidden"))
	}

	can := func(user string, groups []string, verb, group, resource, ns, name string) bool {
		t.Helper()
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: ns, Name: name},
		}}
		if err := cl.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	saGroups := func(ns string) []string {
		return []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	// It only ever needs get and update on what the chart created.
	for _, res := range []struct{ group, resource string }{{"", "configmaps"}, {"coordination.k8s.io", "leases"}} {
		if can(sa, saGroups("rbac-kubevirt"), "create", res.group, res.resource, c.namespace, "") {
			t.Errorf("the sync controller's ServiceAccount may create %s in kvnet's namespace", res.resource)
		}
	}
	const mappings = "kvnet-migration-proxy-mappings"
	for _, verb := range []string{"get", "update", "patch"} {
		if !can(sa, saGroups("rbac-kubevirt"), verb, "", "configmaps", c.namespace, mappings) {
			t.Errorf("the sync controller's ServiceAccount may not %s the mappings ConfigMap", verb)
		}
	}
	if !can(sa, saGroups("rbac-kubevirt"), "patch", "kubevirt.io", "virtualmachineinstances", "tenant", "vm1") {
		t.Errorf("the sync controller's ServiceAccount may not patch a VMI's trigger annotation")
	}
	// Nobody else writes the mappings: KubeVirt's other identities, the
	// separate proxy's ServiceAccount (not bound in sidecar mode), a user.
	// kvnet's own webhook ServiceAccount can (it manages the allocation
	// ConfigMaps in its namespace, whose names RBAC cannot list), but it is
	// the process that serves the rewrite: it gains nothing by writing what
	// it reads.
	for _, who := range []struct {
		user   string
		groups []string
	}{
		{"system:serviceaccount:rbac-kubevirt:kubevirt-handler", saGroups("rbac-kubevirt")},
		{"system:serviceaccount:rbac-kubevirt:kubevirt-controller", saGroups("rbac-kubevirt")},
		{"system:serviceaccount:" + c.namespace + ":kvnet-migration-proxy", saGroups(c.namespace)},
		{"alice", []string{"system:authenticated"}},
	} {
		// Nor the migration bindings: whoever could would rebind a
		// migration to another peer proxy.
		for _, name := range []string{mappings, store.DefaultBindingsName} {
			for _, verb := range []string{"update", "patch"} {
				if can(who.user, who.groups, verb, "", "configmaps", c.namespace, name) {
					t.Errorf("%s may %s ConfigMap %s", who.user, verb, name)
				}
			}
		}
	}
	// Limited to what the proxy needs: not kvnet's controller Lease, not
	// kvnet's other ConfigMaps (its config, the address allocations).
	if can(sa, saGroups("rbac-kubevirt"), "update", "coordination.k8s.io", "leases", c.namespace, "kvnet") {
		t.Errorf("the sync controller's ServiceAccount may update kvnet's controller Lease")
	}
	for _, name := range []string{"kvnet-config", "kvnet-mig-cc-10-20-0-10"} {
		if can(sa, saGroups("rbac-kubevirt"), "update", "", "configmaps", c.namespace, name) {
			t.Errorf("the sync controller's ServiceAccount may update ConfigMap %s", name)
		}
	}
}
