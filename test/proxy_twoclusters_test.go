package test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/test/framework"
)

// refusedCount reads kvnet_proxy_refused_total{side, reason} from the
// registry both proxies of the test export to.
func refusedCount(t *testing.T, side string, reason hop.RefusalCode) float64 {
	t.Helper()
	return metricValue(t, "kvnet_proxy_refused_total", map[string]string{"side": side, "reason": reason.String()})
}

func labelsAre(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(want)
}

func loopbackAddr(t *testing.T, n int) string {
	a := "127.0.0." + strconv.Itoa(n)
	ln, err := net.Listen("tcp", a+":0")
	if err != nil {
		t.Skipf("this kernel does not route %s to loopback; the two-cluster test needs distinct loopback addresses", a)
	}
	_ = ln.Close()
	return a
}

// fakeTargetHandler is the target virt-handler's migration port: mutual
// TLS with KubeVirt's own CA (not the proxies'), echoing every byte. It
// records the client certificate it verified, which shows that the inner
// TLS went through both proxies untouched.
type fakeTargetHandler struct {
	ln       net.Listener
	clientCN chan string
}

func newFakeTargetHandler(t *testing.T, kv *certstest.PKI) *fakeTargetHandler {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{kv.Cert}, ClientCAs: kv.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	h := &fakeTargetHandler{ln: ln, clientCN: make(chan string, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				h.clientCN <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
				_, _ = io.Copy(tc, tc)
				_ = tc.CloseWrite()
			}()
		}
	}()
	return h
}

func (h *fakeTargetHandler) port() string { return strconv.Itoa(h.ln.Addr().(*net.TCPAddr).Port) }

// fakeSourceStream is the source virt-handler's stream: mutual TLS with
// KubeVirt's CA to addr, size random bytes echoed back and compared.
func fakeSourceStream(addr string, kv *certstest.PKI, size int) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{
		Certificates: []tls.Certificate{kv.Cert}, RootCAs: kv.Pool, ServerName: "kubevirt-handler", MinVersion: tls.VersionTLS13,
	})
	if err != nil {
		return fmt.Errorf("inner TLS through the proxies: %w", err)
	}
	defer c.Close()
	data := make([]byte, size)
	_, _ = rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if err := <-werr; err != nil {
		return err
	}
	if a, b := sha256.Sum256(data), sha256.Sum256(got); a != b {
		return fmt.Errorf("sent %d bytes, got %d back with another sha256", len(data), len(got))
	}
	return nil
}

func startProxy(t *testing.T, mgr manager.Manager) {
	t.Helper()
	framework.RunManager(t, mgr)
}

// TestProxyTwoClusters runs a decentralized migration's streams between two
// real control planes through two `kvnet proxy` instances, in each hop mode,
// and tries every way around them.
func TestProxyTwoClusters(t *testing.T) {
	srcAddr, hopAddr, tgtAdvertise := loopbackAddr(t, 2), loopbackAddr(t, 3), loopbackAddr(t, 4)
	outside := loopbackAddr(t, 5)
	b, err := framework.StartCluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	kv := certstest.New(t, "kubevirt-handler") // KubeVirt's own migration CA, shared by the fake handlers

	for _, mode := range []hop.Mode{hop.ModeTLS, hop.ModeAuthenticated} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := context.Background()
			pa, pb, pc, px := certstest.New(t, "cluster-a"), certstest.New(t, "cluster-b"), certstest.New(t, "cluster-c"), certstest.New(t, "intruder")
			// The source namespace names the migration: a VMIM outlives its
			// namespace in envtest, and kvnet refuses a migration ID that a
			// live VMIM of an earlier run (go test -count=N) still holds.
			ns := env.NewNamespace(t, nil)
			migID := "mig-" + ns
			control, direct := newFakeTargetHandler(t, kv), newFakeTargetHandler(t, kv)
			ports := map[string]int{control.port(): 0, direct.port(): 49152}

			// Cluster B, the target: the receiving VMIM and its VMI with the
			// endpoint the target virt-handler announces (in-cluster).
			nsB := fmt.Sprintf("two-%s", mode)
			mustCreate(t, b.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsB}})
			receive := func(vmiName, id string) {
				vmi := &kubevirtv1.VirtualMachineInstance{
					ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: vmiName},
					Spec:       kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{}},
				}
				mustCreate(t, b.Client, vmi)
				// The VM moves from namespace ns of cluster A to nsB:
				// the receiving VMIM approves it by name.
				vmim := &kubevirtv1.VirtualMachineInstanceMigration{
					ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: vmiName + "-in",
						Annotations: map[string]string{proxy.AnnotationMigrationSource: proxy.Approval("cluster-a", hop.VMRef{Namespace: ns, Name: vmiName})}},
					Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmiName,
						Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: id}},
				}
				mustCreate(t, b.Client, vmim)
				vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduled, MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{
					MigrationUID: vmim.UID,
					TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
						VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "node-b", MigrationUID: vmim.UID},
						NodeAddress: ptr.To("127.0.0.1"), DirectMigrationNodePorts: maps.Clone(ports),
					},
				}}
				if err := b.Client.Update(ctx, vmi); err != nil {
					t.Fatal(err)
				}
			}
			// kvnet gave node-b's virt-handler 127.0.0.1 (kvnet itself does
			// not run in cluster B here): the only address the proxy dials.
			allocateHandlerAddress(t, b.Client, framework.KvnetNamespace, "node-b", "127.0.0.1")
			receive("vm1", migID)
			receive("vm2", migID+"-2")

			hopLn, err := net.Listen("tcp", net.JoinHostPort(hopAddr, "0"))
			if err != nil {
				t.Fatal(err)
			}
			mgrB, err := app.NewProxyManager(b.Config, app.ProxyOptions{
				AdvertiseAddress: tgtAdvertise, HopListener: hopLn, Cert: pb.Cert,
				Peers:         []*proxy.Peer{{Name: "cluster-a", CAs: pa.Pool}, {Name: "cluster-c", CAs: pc.Pool}},
				MaxMigrations: 1, QueueWait: 300 * time.Millisecond,
				MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			startProxy(t, mgrB)

			// Cluster A, the source: kvnet's rewrite, the source VMI and VMIM.
			peerB := &proxy.Peer{Name: "cluster-b", Addresses: []string{hopLn.Addr().String()}, CAs: pb.Pool}
			mgrA, err := app.NewProxyManager(env.Config, app.ProxyOptions{
				AdvertiseAddress: srcAddr, Cert: pa.Cert, Mode: mode, Peers: []*proxy.Peer{peerB},
				AllowedSources: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
				MetricsAddr:    "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			startProxy(t, mgrA)
			proxyRegisterWebhook(t, ns)
			vmi := &kubevirtv1.VirtualMachineInstance{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"},
				Spec:       kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{}},
			}
			mustCreate(t, env.Client, vmi)
			vmim := &kubevirtv1.VirtualMachineInstanceMigration{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1-out",
					Annotations: map[string]string{proxy.AnnotationMigrationTarget: nsB + "/vm1"}},
				Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1",
					SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: migID, ConnectURL: "127.0.0.1:9185"}},
			}
			mustCreate(t, env.Client, vmim)
			env.WaitCached(t, &kubevirtv1.VirtualMachineInstanceMigration{}, client.ObjectKeyFromObject(vmim))
			// The source synchronization controller's write: targetState
			// copied from cluster B, top-level fields overwritten from it.
			syncWrite := func() (*kubevirtv1.VirtualMachineInstanceMigrationState, error) {
				var cur kubevirtv1.VirtualMachineInstance
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
					return nil, err
				}
				cur.Status.Phase = kubevirtv1.Running
				cur.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
					MigrationUID: vmim.UID,
					TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
						NodeAddress: ptr.To("127.0.0.1"), DirectMigrationNodePorts: maps.Clone(ports),
					},
					TargetNodeAddress: "127.0.0.1", TargetDirectMigrationNodePorts: maps.Clone(ports),
				}
				if err := env.Client.Update(ctx, &cur); err != nil {
					return nil, err
				}
				return cur.Status.MigrationState, nil
			}
			var local map[string]string // remote port -> source listener port
			proxyEventually(t, "the source virt-handler is pointed at the source proxy", func() error {
				ms, err := syncWrite()
				if err != nil {
					return err
				}
				if ms.TargetNodeAddress != srcAddr || len(ms.TargetDirectMigrationNodePorts) != 2 {
					return fmt.Errorf("stored targetNodeAddress %q ports %v, want %s and 2 ports", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts, srcAddr)
				}
				local = map[string]string{}
				for lp, libvirt := range ms.TargetDirectMigrationNodePorts {
					for rp, l2 := range ports {
						if l2 == libvirt {
							local[rp] = lp
						}
					}
				}
				return nil
			})

			// 1. Both streams reach the target virt-handler, byte-exact, with
			// the inner mutual TLS intact.
			for _, h := range []*fakeTargetHandler{control, direct} {
				if err := fakeSourceStream(net.JoinHostPort(srcAddr, local[h.port()]), kv, 4<<20); err != nil {
					t.Fatalf("stream to target port %s: %v", h.port(), err)
				}
				select {
				case cn := <-h.clientCN:
					if cn != "kubevirt-handler" {
						t.Errorf("the target virt-handler saw client %q", cn)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the target virt-handler never completed the inner handshake")
				}
			}

			// refusedBy runs try and checks that it failed and that the
			// named refusal was counted.
			refusedBy := func(what, side string, reason hop.RefusalCode, try func() error) {
				t.Helper()
				before := refusedCount(t, side, reason)
				if err := try(); err == nil {
					t.Errorf("%s: accepted, want refused (%s)", what, reason)
					return
				}
				proxyEventually(t, what+" is counted", func() error {
					if after := refusedCount(t, side, reason); after < before+1 {
						return fmt.Errorf("kvnet_proxy_refused_total{side=%s,reason=%s} %v -> %v", side, reason, before, after)
					}
					return nil
				})
			}
			// route is the route of migration id of VM vmN (mig-<ns> is
			// vm1's, mig-<ns>-2 vm2's) from ns in cluster A to nsB.
			route := func(id string) hop.Route {
				vm := "vm1"
				if strings.HasSuffix(id, "-2") {
					vm = "vm2"
				}
				return hop.Route{MigrationID: id, Source: hop.VMRef{Namespace: ns, Name: vm}, Target: hop.VMRef{Namespace: nsB, Name: vm}}
			}
			dialAs := func(cert tls.Certificate, id, port string) error {
				p, _ := strconv.Atoi(port)
				c, err := (&proxy.Dialer{Cert: cert, Mode: mode}).Dial(ctx, peerB, route(id), uint16(p))
				if err == nil {
					c.Close()
				}
				return err
			}
			wantReason := func(r hop.RefusalCode, err error) error {
				var re *hop.RefusedError
				if err == nil {
					return nil
				}
				if !errors.As(err, &re) || re.Reason != r {
					t.Errorf("want refusal %s, got %v", r, err)
				}
				return err
			}
			refusedBy("an untrusted peer certificate", "target", hop.RefusedUntrustedPeer, func() error {
				return dialAs(px.Cert, migID, direct.port())
			})
			refusedBy("no client certificate", "target", hop.RefusedNoCertificate, func() error {
				c, err := tls.Dial("tcp", hopLn.Addr().String(), &tls.Config{RootCAs: pb.Pool, ServerName: "cluster-b", MinVersion: tls.VersionTLS13})
				if err != nil {
					return err
				}
				defer c.Close()
				pre, _ := hop.Preamble{Mode: mode, Route: route(migID), Port: 1}.MarshalBinary()
				_, _ = c.Write(pre)
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				if _, err := c.Read(make([]byte, 1)); err != nil {
					return err
				}
				return nil
			})
			refusedBy("an unknown migration ID", "target", hop.RefusedUnknownMigration, func() error {
				return wantReason(hop.RefusedUnknownMigration, dialAs(pa.Cert, "no-such-migration", direct.port()))
			})
			refusedBy("a port the migration did not announce", "target", hop.RefusedPort, func() error {
				return wantReason(hop.RefusedPort, dialAs(pa.Cert, migID, "1"))
			})
			// The receiving VMIM approves cluster-a's VM as its sender, so
			// a second trusted peer naming the same VM is refused before
			// any binding (TestProxyBindings has the binding's own
			// refusal of a second peer, for a VM that keeps its namespace).
			refusedBy("a second trusted peer reusing the migration ID", "target", hop.RefusedWrongVM, func() error {
				return wantReason(hop.RefusedWrongVM, dialAs(pc.Cert, migID, direct.port()))
			})
			// Over the cap (1 on B): hold a stream of the first migration
			// open, then ask for the second.
			held, err := (&proxy.Dialer{Cert: pa.Cert, Mode: mode}).Dial(ctx, peerB, route(migID), uint16(mustAtoi(t, direct.port())))
			if err != nil {
				t.Fatalf("holding a stream: %v", err)
			}
			refusedBy("a migration over the cap", "target", hop.RefusedOverCap, func() error {
				return wantReason(hop.RefusedOverCap, dialAs(pa.Cert, migID+"-2", direct.port()))
			})
			held.Close()
			refusedBy("a client outside the allowed range", "source", hop.RefusedSourceRange, func() error {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(outside)}, Timeout: 10 * time.Second}
				c, err := d.Dial("tcp", net.JoinHostPort(srcAddr, local[direct.port()]))
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				_, err = c.Read(make([]byte, 1))
				return err
			})

			// The VMI editor's redirect: a namespace user who may edit VMIs
			// writes a mapping pointing at an address of their choice.
			editor := vmiEditor(t, ns)
			evil := store.Mapping{MigrationID: migID, Address: outside, Target: "127.0.0.1", Ports: map[string]string{control.port(): "6666", direct.port(): "6667"}}
			var cur kubevirtv1.VirtualMachineInstance
			if err := editor.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
				t.Fatal(err)
			}
			cur.Annotations[store.AnnotationMapping] = evil.Encode()
			if err := editor.Update(ctx, &cur); err != nil {
				t.Fatalf("the editor's annotation write (allowed by RBAC) failed: %v", err)
			}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: framework.KvnetNamespace, Name: store.DefaultMappingsName}}
			patch := fmt.Sprintf(`{"data":{%q:%q}}`, store.Key(types.NamespacedName{Namespace: ns, Name: "vm1"}), evil.Encode())
			if err := editor.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(patch))); !apierrors.IsForbidden(err) {
				t.Errorf("the editor's write of the mappings ConfigMap: got %v, want Forbidden", err)
			}
			for i := range 3 {
				var ms *kubevirtv1.VirtualMachineInstanceMigrationState
				proxyEventually(t, "a sync write after the editor's redirect", func() error {
					var err error
					ms, err = syncWrite() // conflicts while the proxy restores its own annotation
					return err
				})
				if ms.TargetNodeAddress != srcAddr {
					t.Fatalf("sync write %d after the editor's redirect stored targetNodeAddress %q, want the proxy %s", i, ms.TargetNodeAddress, srcAddr)
				}
				for lp := range ms.TargetDirectMigrationNodePorts {
					if lp == "6666" || lp == "6667" {
						t.Fatalf("the editor's ports reached virt-handler: %v", ms.TargetDirectMigrationNodePorts)
					}
				}
			}

			// The migration ends on both sides.
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmim), vmim); err != nil {
				t.Fatal(err)
			}
			vmim.Status.Phase = kubevirtv1.MigrationSucceeded
			if err := env.Client.Status().Update(ctx, vmim); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func mustAtoi(t *testing.T, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func mustCreate(t *testing.T, c client.Client, o client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), o); err != nil {
		t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
	}
}

// vmiEditor is a user with KubeVirt's edit rights on VMIs in ns (as the
// kubevirt.io:edit role grants) and nothing else.
func vmiEditor(t *testing.T, ns string) client.Client {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vmi-editor"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubevirt.io"}, Resources: []string{"virtualmachineinstances", "virtualmachineinstancemigrations"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
	}
	mustCreate(t, env.Client, role)
	mustCreate(t, env.Client, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vmi-editor"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "vmi-editor"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "editor-" + ns}},
	})
	u, err := env.Env.ControlPlane.AddUser(envtest.User{Name: "editor-" + ns}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(u.Config(), client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	_ = ctx
	return c
}
