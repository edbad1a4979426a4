package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/certs"
)

// streamBytes is what the source stand-in sends across: enough to cross
// many TLS records and buffers, little enough for a shared machine.
const streamBytes = 32 << 20

// migrationID names the demo's decentralized migration on both sides.
const migrationID = "demo-migration"

// RunCrossCluster is `make demo-crosscluster`: two control planes, each with
// kvnet, and a `kvnet proxy` in each; a byte stream from a stand-in for the
// source virt-handler in cluster A reaches a stand-in for the target
// virt-handler in cluster B through both proxies, and must arrive intact.
// No virt-handler runs: the stand-ins play its two ends of the stream, and
// the demo writes the VMI status the synchronization controllers would.
func RunCrossCluster(ctx context.Context, o Options, out io.Writer) (err error) {
	if _, err := os.Stat(o.Kvnet); err != nil {
		return fmt.Errorf("kvnet binary: %w (run make build)", err)
	}
	var say sayFunc = func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	sides := make([]*side, 0, 2)
	defer func() {
		say("==> stopping both proxies, both kvnet webhooks and both control planes")
		for _, s := range sides {
			s.stop()
		}
	}()
	for i, name := range []string{"cluster-a", "cluster-b"} {
		s, err := startSide(ctx, o, i+1, name, say)
		if err != nil {
			return err
		}
		sides = append(sides, s)
	}
	a, b := sides[0], sides[1]
	say("==> cross-cluster addresses: %d in %s + %d in %s = %d, one per proxy; virt-handler pods: 0",
		a.crossAddrUsed, a.name, b.crossAddrUsed, b.name, a.crossAddrUsed+b.crossAddrUsed)

	if err := startProxies(ctx, o, a, b, say); err != nil {
		return err
	}
	target, err := listenTargetStandIn(b.handlerAddr)
	if err != nil {
		return err
	}
	defer target.Close()
	say("==> %s: VMI demo/vm1 receives migration %s; the target virt-handler stand-in listens on %s", b.name, migrationID, target.Addr())
	targetPort := strconv.Itoa(target.Addr().(*net.TCPAddr).Port)
	if err := receiveMigration(ctx, b.c, b.handlerAddr.String(), targetPort); err != nil {
		return fmt.Errorf("%s: %w", b.name, err)
	}
	say("==> %s: VMI demo/vm1 sends migration %s; the demo writes the target's endpoint as the synchronization controller would", a.name, migrationID)
	addr, err := sendMigration(ctx, a.c, a.proxyAddr.String(), b.handlerAddr.String(), targetPort)
	if err != nil {
		return fmt.Errorf("%s: %w", a.name, err)
	}
	say("    kvnet's webhook rewrote targetNodeAddress to %s's proxy: the source virt-handler dials %s", a.name, addr)

	say("==> streaming %d bytes from the source stand-in (%s) through both proxies", streamBytes, a.handlerAddr)
	sent, got, err := stream(ctx, a.handlerAddr, addr, target)
	if err != nil {
		return err
	}
	say("    sent:     %d bytes, sha256 %x", sent.n, sent.sum)
	say("    received: %d bytes, sha256 %x (at the target stand-in)", got.n, got.sum)
	if sent != got {
		return errors.New("the stream did not arrive intact")
	}
	say("==> done: the stream crossed %s's proxy and %s's proxy intact", a.name, b.name)
	return nil
}

// proxyCerts writes a CA and a peer certificate (server and client use,
// DNS name = the cluster's name, as the hop's serverName) per cluster.
func proxyCerts(dir, name string) (caFile, crtFile, keyFile string, err error) {
	now := time.Now()
	ca, err := certs.NewCA(name+"-proxy-ca", now, 24*time.Hour)
	if err != nil {
		return "", "", "", err
	}
	kp, err := certs.NewPeer(ca, []string{name}, nil, now, 24*time.Hour)
	if err != nil {
		return "", "", "", err
	}
	caFile, crtFile, keyFile = filepath.Join(dir, "proxy-ca.crt"), filepath.Join(dir, "proxy.crt"), filepath.Join(dir, "proxy.key")
	for f, b := range map[string][]byte{caFile: ca.CertPEM, crtFile: kp.CertPEM, keyFile: kp.KeyPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			return "", "", "", err
		}
	}
	return caFile, crtFile, keyFile, nil
}

// digest is what one end saw of the stream.
type digest struct {
	n   int64
	sum [sha256.Size]byte
}

// listenTargetStandIn is the target virt-handler's migration port, on the
// migration0 address kvnet gave the virt-handler pod of cluster B.
func listenTargetStandIn(addr fmt.Stringer) (net.Listener, error) {
	return net.Listen("tcp", net.JoinHostPort(addr.String(), "0"))
}

// stream sends streamBytes random bytes from the source stand-in's address
// to dial, and reads what the target stand-in accepted on target: its byte
// count and sha256, which it writes back so both ends can be compared.
func stream(ctx context.Context, from fmt.Stringer, dial string, target net.Listener) (sent, got digest, err error) {
	received := make(chan digest, 1)
	recvErr := make(chan error, 1)
	go func() {
		c, err := target.Accept()
		if err != nil {
			recvErr <- err
			return
		}
		defer c.Close()
		h := sha256.New()
		n, err := io.Copy(h, c)
		if err != nil {
			recvErr <- err
			return
		}
		var d digest
		d.n = n
		copy(d.sum[:], h.Sum(nil))
		received <- d
		var buf [8 + sha256.Size]byte
		binary.BigEndian.PutUint64(buf[:8], uint64(n))
		copy(buf[8:], d.sum[:])
		_, _ = c.Write(buf[:])
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from.String())}, Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", dial)
	if err != nil {
		return sent, got, fmt.Errorf("dialing the source proxy %s: %w", dial, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(c, h), io.LimitReader(rand.Reader, streamBytes))
	if err != nil {
		return sent, got, fmt.Errorf("sending: %w", err)
	}
	sent.n = n
	copy(sent.sum[:], h.Sum(nil))
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return sent, got, err
	}
	// The target's report comes back the same way, through both proxies.
	var buf [8 + sha256.Size]byte
	if _, err := io.ReadFull(c, buf[:]); err != nil {
		select {
		case err := <-recvErr:
			return sent, got, fmt.Errorf("the target stand-in: %w", err)
		default:
		}
		return sent, got, fmt.Errorf("reading the target's report back: %w", err)
	}
	select {
	case got = <-received:
	case err := <-recvErr:
		return sent, got, fmt.Errorf("the target stand-in: %w", err)
	}
	var echoed digest
	echoed.n = int64(binary.BigEndian.Uint64(buf[:8]))
	copy(echoed.sum[:], buf[8:])
	if echoed != got {
		return sent, got, errors.New("the target's report came back altered")
	}
	return sent, got, nil
}

// receiveMigration creates cluster B's side of the migration: the VMI and
// the receiving VMIM, and the VMI's targetState with the endpoint the
// target virt-handler announces (written here: no virt-handler runs).
func receiveMigration(ctx context.Context, c client.Client, nodeAddr, port string) error {
	if err := ensureNamespace(ctx, c, "demo"); err != nil {
		return err
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmi.Namespace, vmi.Name = "demo", "vm1"
	if err := c.Create(ctx, vmi); err != nil {
		return err
	}
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{}
	vmim.Namespace, vmim.Name = "demo", "vm1-in"
	vmim.Spec = kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1", Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: migrationID}}
	if err := c.Create(ctx, vmim); err != nil {
		return err
	}
	vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Scheduled, MigrationState: &kubevirtv1.VirtualMachineInstanceMigrationState{
		MigrationUID: vmim.UID,
		TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
			VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "cluster-b-node", MigrationUID: vmim.UID},
			NodeAddress: ptr.To(nodeAddr), DirectMigrationNodePorts: map[string]int{port: 0},
		},
	}}
	return c.Update(ctx, vmi)
}

// sendMigration creates cluster A's side: the VMI and the sending VMIM, and
// repeats the source synchronization controller's write (the target's
// endpoint copied into the VMI status) until kvnet's webhook has pointed
// it at the source proxy. It returns the address the source virt-handler
// would dial.
func sendMigration(ctx context.Context, c client.Client, proxyAddr, nodeAddr, port string) (string, error) {
	if err := ensureNamespace(ctx, c, "demo"); err != nil {
		return "", err
	}
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmi.Namespace, vmi.Name = "demo", "vm1"
	if err := c.Create(ctx, vmi); err != nil {
		return "", err
	}
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{}
	vmim.Namespace, vmim.Name = "demo", "vm1-out"
	vmim.Spec = kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1",
		SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: migrationID, ConnectURL: "cluster-b.example:9185"}}
	if err := c.Create(ctx, vmim); err != nil {
		return "", err
	}
	var dial string
	err := poll(ctx, time.Minute, "the source proxy to publish its listener and kvnet to rewrite the VMI status", func() error {
		var cur kubevirtv1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKeyFromObject(vmi), &cur); err != nil {
			return err
		}
		ports := map[string]int{port: 0}
		cur.Status.Phase = kubevirtv1.Running
		cur.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{
			MigrationUID: vmim.UID,
			TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
				NodeAddress: ptr.To(nodeAddr), DirectMigrationNodePorts: ports,
			},
			TargetNodeAddress: nodeAddr, TargetDirectMigrationNodePorts: map[string]int{port: 0},
		}
		if err := c.Update(ctx, &cur); err != nil {
			return err
		}
		ms := cur.Status.MigrationState
		if ms.TargetNodeAddress != proxyAddr || len(ms.TargetDirectMigrationNodePorts) != 1 {
			return fmt.Errorf("stored targetNodeAddress %q ports %v, want the proxy's %s", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts, proxyAddr)
		}
		for lp := range ms.TargetDirectMigrationNodePorts {
			dial = net.JoinHostPort(proxyAddr, lp)
		}
		return nil
	})
	return dial, err
}

// startProxies runs `kvnet proxy` in each cluster, on the addresses kvnet
// gave that cluster's proxy pod: A's source listeners on its migration0
// (accepting only A's in-cluster pool), B's hop listener on its
// crosscluster0; each trusts only the other's CA. Both stop with their side.
func startProxies(ctx context.Context, o Options, a, b *side, say sayFunc) error {
	hopPort, err := freePortOn(b.proxyHopAddr.String())
	if err != nil {
		return err
	}
	hop := net.JoinHostPort(b.proxyHopAddr.String(), strconv.Itoa(hopPort))
	type files struct{ ca, crt, key string }
	var f [2]files
	for i, s := range []*side{a, b} {
		if f[i].ca, f[i].crt, f[i].key, err = proxyCerts(s.dir, s.name); err != nil {
			return err
		}
	}
	peers := func(s *side, peer string, ca string, addr string) (string, error) {
		path := filepath.Join(s.dir, "proxy-peers.yaml")
		y := fmt.Sprintf("peers:\n  - name: %s\n    addresses: [%q]\n    caFile: %s\n", peer, addr, ca)
		return path, os.WriteFile(path, []byte(y), 0o644)
	}
	// B lists A as its peer; A's proxy has no hop listener, the address is
	// only where it would be.
	peersA, err := peers(a, b.name, f[1].ca, hop)
	if err != nil {
		return err
	}
	peersB, err := peers(b, a.name, f[0].ca, net.JoinHostPort(a.proxyHopAddr.String(), "9444"))
	if err != nil {
		return err
	}
	start := func(s *side, ff files, peersFile string, extra ...string) error {
		probe, err := freePort()
		if err != nil {
			return err
		}
		args := append([]string{"proxy",
			"--advertise-address", s.proxyAddr.String(),
			"--peers", peersFile, "--cert-file", ff.crt, "--key-file", ff.key,
			// No chart here: the proxy creates its mappings and bindings.
			"--namespace", "kvnet-system", "--leader-elect=false", "--create-objects",
			"--metrics-bind-address", "0", "--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", probe),
		}, extra...)
		p, err := startChild(o.Kvnet, args, s.kubeconfig, filepath.Join(s.dir, "proxy.log"), probe)
		if err != nil {
			return err
		}
		s.proxy = p
		return waitProbe(ctx, p, "/healthz", s.name+"'s kvnet proxy to answer /healthz")
	}
	if err := start(b, f[1], peersB, "--hop-listen", hop, "--allowed-sources", b.pool.String()); err != nil {
		return err
	}
	say("==> %s: kvnet proxy, hop listener on %s (its crosscluster0), trusting %s's CA only; log %s", b.name, hop, a.name, filepath.Join(b.dir, "proxy.log"))
	if err := start(a, f[0], peersA, "--allowed-sources", a.pool.String()); err != nil {
		return err
	}
	say("==> %s: kvnet proxy, source listeners on %s (its migration0) for clients in %s, peer %s at %s; log %s", a.name, a.proxyAddr, a.pool, b.name, hop, filepath.Join(a.dir, "proxy.log"))
	return nil
}

// freePortOn is a port free on one local address now.
func freePortOn(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
