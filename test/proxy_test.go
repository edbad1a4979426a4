package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"maps"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

// proxyEventually polls f until it returns nil or the generous deadline
// passes; the last error is the failure message.
func proxyEventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// proxyRegisterWebhook registers webhook.Registration's MigrationProxyWebhook
// (not yet part of Configurations, see its doc) against kvnet's test
// webhook server, for namespace ns only.
func proxyRegisterWebhook(t *testing.T, ns string) {
	t.Helper()
	wio := &env.Env.WebhookInstallOptions
	w := webhook.Registration{}.MigrationProxyWebhook()
	w.ClientConfig = admissionregv1.WebhookClientConfig{
		URL:      ptr.To(fmt.Sprintf("https://%s%s", net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort)), webhook.PathMutateVMIMigrationStatus)),
		CABundle: wio.LocalServingCAData,
	}
	w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	mwc := &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kvnet-migration-proxy-" + ns},
		Webhooks:   []admissionregv1.MutatingWebhook{w},
	}
	if err := env.Client.Create(context.Background(), mwc); err != nil {
		t.Fatalf("registering the migration proxy webhook: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), mwc) })
}

// proxyEchoTarget is a fake remote virt-handler migration port on 127.0.0.1:
// it echoes every byte back and counts its connections.
type proxyEchoTarget struct {
	ln       net.Listener
	accepted atomic.Int32
}

func newProxyEchoTarget(t *testing.T) *proxyEchoTarget {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	e := &proxyEchoTarget{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.accepted.Add(1)
			go func() {
				defer c.Close()
				if _, err := io.Copy(c, c); err == nil {
					_ = c.(*net.TCPConn).CloseWrite()
				}
			}()
		}
	}()
	return e
}

func (e *proxyEchoTarget) port() string {
	return strconv.Itoa(e.ln.Addr().(*net.TCPAddr).Port)
}

// proxyAddress is the proxy's advertised address: 127.0.0.2 where the
// loopback takes it (Linux routes all of 127/8), so that an address copied
// from the target (127.0.0.1) cannot pass for the proxy's; else 127.0.0.1.
func proxyAddress(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Logf("127.0.0.2 not usable (%v); the proxy advertises 127.0.0.1", err)
		return "127.0.0.1"
	}
	_ = ln.Close()
	return "127.0.0.2"
}

// proxyRoundTrip sends size random bytes to addr while reading the echo,
// and compares both directions by sha256.
func proxyRoundTrip(addr string, size int) error {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		return err
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("reading the echo through the proxy: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("writing through the proxy: %w", err)
	}
	if want, have := sha256.Sum256(data), sha256.Sum256(got); !bytes.Equal(want[:], have[:]) {
		return fmt.Errorf("sent %d bytes (sha256 %x), got %d back (sha256 %x)", len(data), want, len(got), have)
	}
	return nil
}

// TestProxyDecentralizedMigration drives the source side of a decentralized
// live migration through the real API server: the synchronization
// controller's status writes, kvnet's rewrite webhook, the proxy controller
// and its relays.
func TestProxyDecentralizedMigration(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	// Unique in the run: a VMIM outlives its namespace in envtest, and
	// kvnet refuses a migration ID a live VMIM still holds (go test -count=N).
	migID := "mig-" + ns
	proxyRegisterWebhook(t, ns)
	proxyAddr := proxyAddress(t)

	// The target cluster's virt-handler: two migration ports on 127.0.0.1,
	// one for libvirt's control connection (0) and one for the direct
	// migration stream (49152).
	control, direct := newProxyEchoTarget(t), newProxyEchoTarget(t)
	const targetAddr = "127.0.0.1"
	remotePorts := map[string]int{control.port(): 0, direct.port(): 49152}

	// The VM, its VMI as virt-controller creates it, and the source VMIM as
	// a user creates it for a decentralized migration.
	vm := &kubevirtv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1"},
		Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"kubevirt.io/vm": "vm1"}},
				Spec:       kubevirtv1.VirtualMachineInstanceSpec{Domain: kubevirtv1.DomainSpec{}},
			},
		},
	}
	if err := env.Client.Create(ctx, vm); err != nil {
		t.Fatalf("creating the VM: %v", err)
	}
	vmi := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "vm1",
			Labels:      map[string]string{"kubevirt.io/vm": "vm1", "kubevirt.io/nodeName": "node-a"},
			Annotations: map[string]string{"kubevirt.io/vm-generation": fmt.Sprint(vm.Generation)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: vm.Name, UID: vm.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec:   *vm.Spec.Template.Spec.DeepCopy(),
		Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running, NodeName: "node-a"},
	}
	if err := env.Client.Create(ctx, vmi); err != nil {
		t.Fatalf("creating the VMI: %v", err)
	}
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm1-out", Labels: map[string]string{"kubevirt.io/vmi-name": "vm1"}},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{
			VMIName: "vm1",
			SendTo:  &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: migID, ConnectURL: "127.0.0.1:9185"},
		},
	}
	if err := env.Client.Create(ctx, vmim); err != nil {
		t.Fatalf("creating the VMIM: %v", err)
	}
	vmim.Status.Phase = kubevirtv1.MigrationSynchronizing
	if err := env.Client.Status().Update(ctx, vmim); err != nil {
		t.Fatalf("setting the VMIM phase: %v", err)
	}
	env.WaitCached(t, &kubevirtv1.VirtualMachineInstanceMigration{}, client.ObjectKeyFromObject(vmim))

	// syncWrite is the source synchronization controller's sync: targetState
	// copied from the target and the top-level fields overwritten from it,
	// in one UPDATE of the VMI (it has no status subresource). It returns
	// the stored migrationState.
	syncWrite := func() (*kubevirtv1.VirtualMachineInstanceMigrationState, error) {
		var cur kubevirtv1.VirtualMachineInstance
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return nil, err
		}
		cur.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
			MigrationUID: vmim.UID, SourceNode: "node-a",
			SourceState: &kubevirtv1.VirtualMachineInstanceMigrationSourceState{
				VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{
					Node: "node-a", MigrationUID: vmim.UID, SyncAddress: ptr.To("127.0.0.1:9185"),
				},
			},
			TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
				VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{
					Node: "remote-node", Pod: "virt-launcher-vm1-remote", SyncAddress: ptr.To("127.0.0.1:9186"),
				},
				NodeAddress: ptr.To(targetAddr), DirectMigrationNodePorts: maps.Clone(remotePorts),
			},
			TargetNodeAddress: targetAddr, TargetDirectMigrationNodePorts: maps.Clone(remotePorts),
		}
		if err := env.Client.Update(ctx, &cur); err != nil {
			return nil, err
		}
		return cur.Status.MigrationState, nil
	}
	truthful := func(ms *kubevirtv1.VirtualMachineInstanceMigrationState) error {
		ts := ms.TargetState
		if ts == nil || ts.NodeAddress == nil || *ts.NodeAddress != targetAddr || !maps.Equal(ts.DirectMigrationNodePorts, remotePorts) {
			return fmt.Errorf("targetState is no longer the real endpoint: %+v", ts)
		}
		return nil
	}

	// 1. Without relays the remote endpoint must not reach virt-handler.
	proxyEventually(t, "the sync write before the proxy runs keeps the top-level fields empty", func() error {
		ms, err := syncWrite()
		if err != nil {
			return err
		}
		if ms.TargetNodeAddress != "" || ms.TargetDirectMigrationNodePorts != nil {
			return fmt.Errorf("stored targetNodeAddress %q, ports %v; want both empty", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts)
		}
		return truthful(ms)
	})

	// 2. The proxy opens relays and publishes them; the stored top-level
	// fields now point at it.
	mgr, err := app.NewProxyManager(env.Config, app.ProxyOptions{AdvertiseAddress: proxyAddr, MetricsAddr: "0", ProbeAddr: "0", Namespace: framework.KvnetNamespace, CreateObjects: true})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy manager: %v", err)
		}
	})

	var mapping store.Mapping
	var wantPorts map[string]int
	proxyEventually(t, "the proxy publishes its relays and the stored fields point at it", func() error {
		var cur kubevirtv1.VirtualMachineInstance
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return err
		}
		ann, ok := cur.Annotations[store.AnnotationMapping]
		if !ok {
			return fmt.Errorf("no %s annotation yet", store.AnnotationMapping)
		}
		m, err := store.DecodeMapping(ann)
		if err != nil {
			return err
		}
		if m.MigrationID != migID || m.Address != proxyAddr || m.Target != targetAddr || len(m.Ports) != 2 {
			return fmt.Errorf("mapping %+v, want migration %s, address %s, target %s, 2 ports", m, migID, proxyAddr, targetAddr)
		}
		want := map[string]int{}
		for remote, local := range m.Ports {
			if local == remote && proxyAddr == targetAddr {
				return fmt.Errorf("local port %s equals the remote one on the same address", local)
			}
			want[local] = remotePorts[remote]
		}
		ms := cur.Status.MigrationState
		if ms.TargetNodeAddress != proxyAddr || !maps.Equal(ms.TargetDirectMigrationNodePorts, want) {
			return fmt.Errorf("stored targetNodeAddress %q, ports %v; want %s, %v", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts, proxyAddr, want)
		}
		mapping, wantPorts = m, want
		return truthful(ms)
	})

	// 3. The synchronization controller keeps writing the truthful values;
	// every write stores the proxy's, never the remote ones (no flapping).
	for i := range 3 {
		ms, err := syncWrite()
		if err != nil {
			t.Fatalf("sync write %d: %v", i, err)
		}
		if ms.TargetNodeAddress != proxyAddr || !maps.Equal(ms.TargetDirectMigrationNodePorts, wantPorts) {
			t.Fatalf("sync write %d stored targetNodeAddress %q, ports %v; want %s, %v", i, ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts, proxyAddr, wantPorts)
		}
		if err := truthful(ms); err != nil {
			t.Fatal(err)
		}
	}

	// 4. Bytes sent to the advertised address reach the right target, in
	// both directions, byte-exact.
	for remote, local := range mapping.Ports {
		if err := proxyRoundTrip(net.JoinHostPort(proxyAddr, local), 2<<20); err != nil {
			t.Fatalf("relay %s:%s -> %s:%s: %v", proxyAddr, local, targetAddr, remote, err)
		}
	}
	if control.accepted.Load() != 1 || direct.accepted.Load() != 1 {
		t.Errorf("each target should have seen exactly one relayed connection: control %d, direct %d", control.accepted.Load(), direct.accepted.Load())
	}

	// 4b. The target reports another endpoint (a block-migration port is
	// added): the published mapping no longer matches, so the write that
	// brings it is held back; the proxy replaces its relays and publishes.
	block := newProxyEchoTarget(t)
	oldMapping := mapping
	remotePorts = map[string]int{control.port(): 0, direct.port(): 49152, block.port(): 49153}
	ms, err := syncWrite()
	if err != nil {
		t.Fatal(err)
	}
	if ms.TargetNodeAddress != "" || ms.TargetDirectMigrationNodePorts != nil {
		t.Fatalf("a write with a new endpoint and the old mapping stored targetNodeAddress %q, ports %v; want both empty", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts)
	}
	proxyEventually(t, "the proxy publishes relays for the new endpoint", func() error {
		var cur kubevirtv1.VirtualMachineInstance
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return err
		}
		m, err := store.DecodeMapping(cur.Annotations[store.AnnotationMapping])
		if err != nil {
			return err
		}
		if len(m.Ports) != 3 {
			return fmt.Errorf("mapping %+v, want 3 ports", m)
		}
		want := map[string]int{}
		for remote, local := range m.Ports {
			want[local] = remotePorts[remote]
		}
		if ms := cur.Status.MigrationState; ms.TargetNodeAddress != proxyAddr || !maps.Equal(ms.TargetDirectMigrationNodePorts, want) {
			return fmt.Errorf("stored targetNodeAddress %q, ports %v; want %s, %v", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts, proxyAddr, want)
		}
		mapping = m
		return truthful(cur.Status.MigrationState)
	})
	inUse := map[string]bool{}
	for _, local := range mapping.Ports {
		inUse[local] = true
	}
	for _, local := range oldMapping.Ports {
		if inUse[local] {
			continue // the kernel handed the same port out again
		}
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(proxyAddr, local), 5*time.Second); err == nil {
			c.Close()
			t.Errorf("the relay for the old endpoint on %s:%s still accepts", proxyAddr, local)
		}
	}
	for remote, local := range mapping.Ports {
		if err := proxyRoundTrip(net.JoinHostPort(proxyAddr, local), 1<<20); err != nil {
			t.Fatalf("relay %s:%s -> %s:%s: %v", proxyAddr, local, targetAddr, remote, err)
		}
	}
	if block.accepted.Load() != 1 {
		t.Errorf("the block-migration target saw %d relayed connections, want 1", block.accepted.Load())
	}

	// 4c. The rule's matchConditions skip finished migrations (migrationState
	// stays on the VMI afterwards): a write with completed=true is stored as
	// written, kvnet is not called.
	var done1 kubevirtv1.VirtualMachineInstance
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &done1); err != nil {
		t.Fatal(err)
	}
	done1.Status.MigrationState.Completed = true
	done1.Status.MigrationState.TargetNodeAddress = targetAddr
	done1.Status.MigrationState.TargetDirectMigrationNodePorts = maps.Clone(remotePorts)
	if err := env.Client.Update(ctx, &done1); err != nil {
		t.Fatal(err)
	}
	if ms := done1.Status.MigrationState; ms.TargetNodeAddress != targetAddr || !maps.Equal(ms.TargetDirectMigrationNodePorts, remotePorts) {
		t.Errorf("a completed migration's write was rewritten: targetNodeAddress %q, ports %v", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts)
	}

	// 5. The migration ends: the relays close and the mapping goes away.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmim), vmim); err != nil {
		t.Fatal(err)
	}
	vmim.Status.Phase = kubevirtv1.MigrationSucceeded
	if err := env.Client.Status().Update(ctx, vmim); err != nil {
		t.Fatalf("completing the VMIM: %v", err)
	}
	proxyEventually(t, "the relays close when the migration ends", func() error {
		for _, local := range mapping.Ports {
			if c, err := net.DialTimeout("tcp", net.JoinHostPort(proxyAddr, local), 5*time.Second); err == nil {
				c.Close()
				return fmt.Errorf("%s:%s still accepts", proxyAddr, local)
			}
		}
		var cur kubevirtv1.VirtualMachineInstance
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return err
		}
		if v, ok := cur.Annotations[store.AnnotationMapping]; ok {
			return fmt.Errorf("annotation still there: %s", v)
		}
		return nil
	})
}

// TestProxyLeavesNonSourcesAlone: the rewrite touches only sources of a
// decentralized migration. A local migration (no VMIM with sendTo) and the
// target side (VMIM with receive), whose fields the target virt-handler
// owns, keep what was written.
func TestProxyLeavesNonSourcesAlone(t *testing.T) {
	ctx := context.Background()
	ns := env.NewNamespace(t, nil)
	proxyRegisterWebhook(t, ns)
	ports := map[string]int{"40001": 0, "40002": 49152}

	// First a source, until its write is held back: then the rule is live in
	// the API server's admission chain, and the writes below are really
	// sent to kvnet rather than passing before it is registered.
	src := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "source"},
		Status:     kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running, NodeName: "node-a"},
	}
	if err := env.Client.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	srcMig := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "source-out", Labels: map[string]string{"kubevirt.io/vmi-name": "source"}},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "source",
			SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: "mig-out-" + ns, ConnectURL: "127.0.0.1:9185"}},
	}
	if err := env.Client.Create(ctx, srcMig); err != nil {
		t.Fatal(err)
	}
	proxyEventually(t, "the rule holds back a source's remote endpoint", func() error {
		var cur kubevirtv1.VirtualMachineInstance
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(src), &cur); err != nil {
			return err
		}
		cur.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
			MigrationUID: srcMig.UID,
			TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
				NodeAddress: ptr.To("127.0.0.1"), DirectMigrationNodePorts: maps.Clone(ports),
			},
			TargetNodeAddress: "127.0.0.1", TargetDirectMigrationNodePorts: maps.Clone(ports),
		}
		if err := env.Client.Update(ctx, &cur); err != nil {
			return err
		}
		if ms := cur.Status.MigrationState; ms.TargetNodeAddress != "" || ms.TargetDirectMigrationNodePorts != nil {
			return fmt.Errorf("stored targetNodeAddress %q, ports %v", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts)
		}
		return nil
	})

	for _, tc := range []struct {
		name string
		vmim *kubevirtv1.VirtualMachineInstanceMigrationSpec
	}{
		{name: "local", vmim: &kubevirtv1.VirtualMachineInstanceMigrationSpec{}},
		{name: "target", vmim: &kubevirtv1.VirtualMachineInstanceMigrationSpec{Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: "mig-in-" + ns}}},
	} {
		vmi := &kubevirtv1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name},
			Status:     kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running, NodeName: "node-a"},
		}
		if err := env.Client.Create(ctx, vmi); err != nil {
			t.Fatalf("creating VMI %s: %v", tc.name, err)
		}
		spec := *tc.vmim
		spec.VMIName = tc.name
		vmim := &kubevirtv1.VirtualMachineInstanceMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name + "-mig", Labels: map[string]string{"kubevirt.io/vmi-name": tc.name}},
			Spec:       spec,
		}
		if err := env.Client.Create(ctx, vmim); err != nil {
			t.Fatalf("creating VMIM for %s: %v", tc.name, err)
		}
		vmi.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
			MigrationUID: vmim.UID,
			TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
				NodeAddress: ptr.To("127.0.0.1"), DirectMigrationNodePorts: maps.Clone(ports),
			},
			TargetNodeAddress: "127.0.0.1", TargetDirectMigrationNodePorts: maps.Clone(ports),
		}
		if err := env.Client.Update(ctx, vmi); err != nil {
			t.Fatalf("status write of %s: %v", tc.name, err)
		}
		if ms := vmi.Status.MigrationState; ms.TargetNodeAddress != "127.0.0.1" || !maps.Equal(ms.TargetDirectMigrationNodePorts, ports) {
			t.Errorf("%s: stored targetNodeAddress %q, ports %v; want the written values", tc.name, ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts)
		}
	}
}
