package test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

// certsLabel marks the namespace of the certificate tests; their webhook
// configurations select only it, so the rest of the suite never calls the
// short-lived replicas started here.
const certsLabel = "kvnet.io/certs-test"

// Two replicas racing to create the Secret agree on one: exactly one Create
// wins and both serve the same key pair. The race is run several times, as
// one round may not overlap.
func TestSelfManagedCertsRacingReplicasAgree(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	flags := app.CertFlags{Mode: app.CertModeSelfManaged, Secret: "race", ServiceName: "kvnet"}
	for round := range 5 {
		created := certs.RotationCount("created")
		dirs := []string{t.TempDir(), t.TempDir()}
		var rs []*certs.Rotator
		for _, dir := range dirs {
			o, err := flags.Options(ns, dir)
			if err != nil {
				t.Fatal(err)
			}
			r, err := certs.New(env.Client, o, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		start := make(chan struct{})
		errs := make([]error, len(rs))
		var wg sync.WaitGroup
		for i, r := range rs {
			wg.Go(func() {
				<-start
				errs[i] = r.EnsureReady(t.Context())
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d replica %d: %v", round, i, err)
			}
		}
		if got := certs.RotationCount("created") - created; got != 1 {
			t.Fatalf("round %d: %v replicas created the Secret, want exactly 1", round, got)
		}
		a, b := readFile(t, dirs[0]+"/tls.crt"), readFile(t, dirs[1]+"/tls.crt")
		if !bytes.Equal(a, b) {
			t.Fatalf("round %d: the replicas serve different certificates", round)
		}
		var s corev1.Secret
		if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "race"}, &s); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(s.Data[corev1.TLSCertKey], a) {
			t.Fatalf("round %d: the replicas serve a certificate that is not the Secret's", round)
		}
		if err := env.Client.Delete(t.Context(), &s); err != nil {
			t.Fatal(err)
		}
	}
}

// The whole self-managed path with two kvnet replicas behind a
// load-balancing proxy: the CA bundle lands in both webhook configurations,
// and while the serving certificate is renewed several times and the CA
// itself is rotated, clients keep calling the webhook, through the API
// server and directly on each replica with a fresh TLS handshake, and not
// one call fails.
//
// The rotators run on a clock the test moves ahead in steps of 11 minutes,
// each once both replicas serve what the previous step produced; the
// certificates live for hours in real time. So "not one call fails" holds
// on a machine of any speed: a starved replica rotates late, never serves
// an expired certificate. (The certificates are backdated by an hour, which
// keeps those issued at a clock up to an hour ahead valid now.)
func TestSelfManagedCertsRotateWithoutFailedCalls(t *testing.T) {
	ns := env.NewNamespace(t, map[string]string{certsLabel: "true"})
	ctx := t.Context()

	// Two replicas, each with its own cert dir and port, as two pods.
	ports := []int{framework.FreePort(t), framework.FreePort(t)}
	proxy := newRoundRobin(t, ports)
	name := "kvnet-certs-test"
	registerURLWebhooks(t, name, proxy, map[string]string{certsLabel: "true"})

	var ahead atomic.Int64 // how far the rotators' clock runs ahead of time.Now
	flags := app.CertFlags{
		Mode: app.CertModeSelfManaged, Secret: "kvnet-webhook-cert", ConfigNames: []string{name},
		ExtraSANs: []string{"127.0.0.1"},
		// Renewal when a certificate is 10 minutes old, CA staging at 15
		// minutes: three clock steps give four certificates from two CAs,
		// with the clock at most 33 minutes ahead.
		CALifetime: 3 * time.Hour, CARenewBefore: 165 * time.Minute,
		CertLifetime: 50 * time.Minute, CertRenewBefore: 40 * time.Minute,
		Interval: 250 * time.Millisecond,
		Now:      func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) },
	}
	cfg, err := config.Parse(nil, framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, port := range ports {
		dir := t.TempDir()
		so := app.ServeOptions{
			Host: "127.0.0.1", Port: port, CertDir: dir, MetricsAddr: "0", ProbeAddr: "0",
			TLSMinVersion: "1.2", Namespace: ns,
		}
		mgr, err := replicaManager(so, config.Static(cfg))
		if err != nil {
			t.Fatal(err)
		}
		if err := app.SetUpCerts(ctx, mgr, flags, &so); err != nil {
			t.Fatal(err)
		}
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mgr.Start(mctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("replica on port %d: %v", port, err)
			}
		})
		framework.Eventually(t, "replica to serve TLS", 30*time.Second, func() error { return mgr.GetWebhookServer().StartedChecker()(nil) })
	}

	// Both configurations, every webhook, carry the Secret's bundle.
	var secret corev1.Secret
	framework.Eventually(t, "CA bundle injected into both configurations", 30*time.Second, func() error {
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "kvnet-webhook-cert"}, &secret); err != nil {
			return err
		}
		return bundlesEqual(ctx, name, secret.Data["ca.crt"])
	})

	// Callers run until every replica has served at least four certificates
	// and one signed by a second CA, then stop; every failure is kept.
	var (
		mu       sync.Mutex
		failures []string
		calls    atomic.Int64
		serials  = make([]map[string]bool, len(ports))
		issuers  = make([]map[string]bool, len(ports))
	)
	for i := range ports {
		serials[i], issuers[i] = map[string]bool{}, map[string]bool{}
	}
	fail := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, a...))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Through the API server, as users do.
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			vm := &kubevirtv1.VirtualMachine{}
			fromYAML(t, plainVM, vm)
			vm.Namespace, vm.Name = ns, fmt.Sprintf("vm-%d", i)
			calls.Add(1)
			if err := env.Client.Create(ctx, vm, client.DryRunAll); err != nil {
				fail("API server call %d: %v", i, err)
			}
		}
	})
	// Directly on each replica, with a fresh handshake verified against the
	// bundle the API server currently has, as its next new connection would.
	for i, port := range ports {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				serial, issuer, err := callReplica(ctx, name, port)
				if err != nil {
					fail("replica %d: %v", i, err)
					continue
				}
				mu.Lock()
				serials[i][serial], issuers[i][issuer] = true, true
				mu.Unlock()
			}
		})
	}
	served := func() (n []int, done bool) {
		mu.Lock()
		defer mu.Unlock()
		done = true
		for i := range ports {
			n = append(n, len(serials[i]))
			done = done && len(serials[i]) >= 4 && len(issuers[i]) >= 2
		}
		return n, done
	}
	framework.Eventually(t, "both replicas called at least once", 30*time.Second, func() error {
		if n, _ := served(); slices.Contains(n, 0) {
			return fmt.Errorf("certificates seen per replica: %v", n)
		}
		return nil
	})
	for step := 1; ; step++ {
		before, done := served()
		if done {
			break
		}
		if step > 6 {
			t.Fatalf("after %d clock steps, certificates per replica %v, without 4 from 2 CAs each", step-1, before)
		}
		ahead.Add(int64(11 * time.Minute))
		framework.Eventually(t, fmt.Sprintf("both replicas to serve a new certificate after clock step %d", step), 2*time.Minute, func() error {
			now, _ := served()
			for i := range now {
				if now[i] <= before[i] {
					return fmt.Errorf("certificates per replica %v, before the step %v", now, before)
				}
			}
			return nil
		})
	}
	close(stop)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed during rotation; first: %s", len(failures), calls.Load(), strings.Join(failures[:min(5, len(failures))], "\n"))
	}
	t.Logf("%d calls, none failed; serials per replica: %d, %d", calls.Load(), len(serials[0]), len(serials[1]))
	// The bundle still matches after the CA rotation.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&secret), &secret); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "CA bundle re-injected after rotation", 30*time.Second, func() error { return bundlesEqual(ctx, name, secret.Data["ca.crt"]) })
}

// replicaManager is a kvnet replica reduced to its webhook server and
// handlers. app.NewManager cannot run twice in one process next to the
// suite's own kvnet: controller-runtime refuses a second controller with the
// same name. The certificate path, the server and its certwatcher are the
// same as in kvnet.
func replicaManager(so app.ServeOptions, cfg *config.Source) (manager.Manager, error) {
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 app.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: ctrlwebhook.NewServer(ctrlwebhook.Options{
			Host: so.Host, Port: so.Port, CertDir: so.CertDir,
			TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
		}),
	})
	if err != nil {
		return nil, err
	}
	webhook.Register(mgr.GetWebhookServer(), webhook.NewHandlers(cfg, lookup.NewReader(mgr.GetCache()), app.Chains(app.Capabilities{})))
	return mgr, nil
}

// callReplica sends one AdmissionReview to a replica over a new TLS
// connection trusting only the mutating configuration's CA bundle, and
// returns the serial and issuer of the certificate it presented.
func callReplica(ctx context.Context, config string, port int) (serial, issuer string, err error) {
	var mwc admissionregv1.MutatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: config}, &mwc); err != nil {
		return "", "", err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle) {
		return "", "", fmt.Errorf("configuration has no usable CA bundle")
	}
	var peer *x509.Certificate
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{
		RootCAs: pool, ServerName: "127.0.0.1",
		VerifyConnection: func(cs tls.ConnectionState) error { peer = cs.PeerCertificates[0]; return nil },
	}}
	defer tr.CloseIdleConnections()
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "rotation-probe",
			Kind:      metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"},
			Resource:  metav1.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachines"},
			Namespace: "probe", Name: "probe", Operation: admissionv1.Create,
			Object: runtime.RawExtension{Raw: []byte(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"probe","namespace":"probe"},"spec":{"template":{"spec":{"domain":{"devices":{}}}}}}`)},
		},
	}
	body, _ := json.Marshal(review)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("https://127.0.0.1:%d%s", port, webhook.PathValidateVM), bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	var out admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil {
		return "", "", fmt.Errorf("status %d, undecodable review: %v", resp.StatusCode, err)
	}
	return peer.SerialNumber.String(), string(peer.AuthorityKeyId), nil
}

// bundlesEqual checks every webhook of both configurations named name.
func bundlesEqual(ctx context.Context, name string, bundle []byte) error {
	var m admissionregv1.MutatingWebhookConfiguration
	var v admissionregv1.ValidatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &m); err != nil {
		return err
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &v); err != nil {
		return err
	}
	for _, w := range m.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, bundle) {
			return fmt.Errorf("mutating webhook %s has another CA bundle", w.Name)
		}
	}
	for _, w := range v.Webhooks {
		if !bytes.Equal(w.ClientConfig.CABundle, bundle) {
			return fmt.Errorf("validating webhook %s has another CA bundle", w.Name)
		}
	}
	return nil
}

// registerURLWebhooks registers kvnet's configurations, exactly as
// webhook.Registration builds them, but calling addr by URL and selecting
// only namespaces with nsLabels. They carry no CA bundle: kvnet injects it.
func registerURLWebhooks(t *testing.T, name, addr string, nsLabels map[string]string) {
	t.Helper()
	m, v := webhook.Registration{Name: name}.Configurations()
	url := func(cc *admissionregv1.WebhookClientConfig) {
		cc.URL = ptr.To("https://" + addr + *cc.Service.Path)
		cc.Service = nil
	}
	for i := range m.Webhooks {
		url(&m.Webhooks[i].ClientConfig)
		m.Webhooks[i].NamespaceSelector.MatchLabels = nsLabels
	}
	for i := range v.Webhooks {
		url(&v.Webhooks[i].ClientConfig)
		v.Webhooks[i].NamespaceSelector.MatchLabels = nsLabels
	}
	ctx := context.Background()
	for _, obj := range []client.Object{m, v} {
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("registering %T: %v", obj, err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
	}
}

// newRoundRobin is a TCP proxy on 127.0.0.1 sending each new connection to
// the next port: a Service in front of the replicas.
func newRoundRobin(t *testing.T, ports []int) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var next atomic.Int64
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			port := ports[int(next.Add(1))%len(ports)]
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
				if err != nil {
					return
				}
				defer out.Close()
				done := make(chan struct{}, 2)
				copyHalf := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					if c, ok := dst.(*net.TCPConn); ok {
						_ = c.CloseWrite()
					}
					done <- struct{}{}
				}
				go copyHalf(out, in)
				go copyHalf(in, out)
				<-done
				<-done
			}()
		}
	}()
	return l.Addr().String()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testLog sends a component's logs to the test's log.
func testLog(t *testing.T) logr.Logger { return testr.New(t) }

// A renamed Service gets a certificate for its new names from the same CA
// (so the webhook configurations need no change), an unusable Secret is
// replaced instead of wedging every replica, and missing webhook
// configurations do not keep kvnet from serving.
func TestSelfManagedCertsReissueRecoverAndStartWithoutConfigurations(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	ctx := t.Context()
	dir := t.TempDir()
	rotator := func(service string, configs ...string) *certs.Rotator {
		t.Helper()
		o, err := app.CertFlags{Mode: app.CertModeSelfManaged, Secret: "c", ServiceName: service, ConfigNames: configs}.Options(ns, dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := certs.New(env.Client, o, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	secret := func() *corev1.Secret {
		var s corev1.Secret
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "c"}, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}

	// No configuration named "absent" exists: the key pair is written
	// anyway, and the pass reports what it could not inject.
	r := rotator("kvnet", "absent")
	if err := r.EnsureReady(ctx); err != nil {
		t.Fatalf("EnsureReady without webhook configurations: %v", err)
	}
	if err := r.ReadyCheck(nil); err != nil {
		t.Fatalf("not ready after EnsureReady: %v", err)
	}
	if err := r.Reconcile(ctx); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Fatalf("Reconcile error = %v, want one naming the missing configuration", err)
	}
	first := secret()

	reissued := certs.RotationCount("serving-reissued")
	if err := rotator("kvnet-renamed").Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	second := secret()
	if got := certs.RotationCount("serving-reissued") - reissued; got != 1 {
		t.Fatalf("serving-reissued rose by %v, want 1", got)
	}
	if !bytes.Equal(first.Data["ca.crt"], second.Data["ca.crt"]) {
		t.Fatal("renaming the Service changed the CA bundle")
	}
	kp, err := certs.ParseKeyPair(readFile(t, dir+"/tls.crt"), readFile(t, dir+"/tls.key"))
	if err != nil {
		t.Fatalf("cert dir: %v", err)
	}
	if !slices.Contains(kp.Cert.DNSNames, "kvnet-renamed."+ns+".svc") {
		t.Fatalf("served certificate names %v, want the renamed Service", kp.Cert.DNSNames)
	}

	second.Data["tls.key"] = []byte("not a key")
	if err := env.Client.Update(ctx, second); err != nil {
		t.Fatal(err)
	}
	invalid := certs.RotationCount("invalid")
	if err := rotator("kvnet-renamed").Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := certs.RotationCount("invalid") - invalid; got != 1 {
		t.Fatalf("invalid rose by %v, want 1", got)
	}
	third := secret()
	if _, err := certs.ParseKeyPair(third.Data["tls.crt"], third.Data["tls.key"]); err != nil {
		t.Fatalf("the replaced Secret is still unusable: %v", err)
	}
	// Replicas still serving the old certificate stay trusted until they
	// adopt the new one: the old CA remains in the bundle.
	oldCA, err := certs.ParseCerts(second.Data["ca-signer.crt"])
	if err != nil {
		t.Fatal(err)
	}
	if !certs.BundleContains(third.Data["ca.crt"], oldCA[0]) {
		t.Fatal("replacing an unusable Secret dropped the old CA from the bundle")
	}
}
