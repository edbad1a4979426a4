package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// DefaultHandshakeTimeout bounds the TCP connect, TLS handshake, preamble
// and verdict of the hop between proxies.
const DefaultHandshakeTimeout = 10 * time.Second

// Peer is another cluster's proxy, configured by name.
type Peer struct {
	// Name is the peer cluster's name: the name its streams are bound to
	// and the one in logs and metrics.
	Name string
	// Addresses are the peer proxy's hop listeners (host:port), tried in
	// order.
	Addresses []string
	// CAs verify the peer's certificate, when it serves (as the target) and
	// when it dials (as the source); SetCAs replaces them while streams
	// run (the CA reloader does, when CAFile changes).
	CAs *x509.CertPool
	// CAFile, if set, is the PEM file CAs were read from: a CAReloader
	// reads it again when it changes.
	CAFile string
	// ServerName is the name the peer's serving certificate must carry;
	// empty means Name.
	ServerName string
	// ConnectHosts are the hosts of the VMIMs' spec.sendTo.connectURL that
	// lead to this peer (its synchronization controller addresses). With a
	// single peer configured they may be left empty.
	ConnectHosts []string

	reloaded atomic.Pointer[x509.CertPool]
}

// Pool is the peer's CAs now: the last SetCAs, else CAs.
func (p *Peer) Pool() *x509.CertPool {
	if pool := p.reloaded.Load(); pool != nil {
		return pool
	}
	return p.CAs
}

// SetCAs replaces the peer's CAs for every handshake from now on.
func (p *Peer) SetCAs(pool *x509.CertPool) { p.reloaded.Store(pool) }

func (p *Peer) serverName() string {
	if p.ServerName != "" {
		return p.ServerName
	}
	return p.Name
}

// verifyChain reports whether leaf (with the intermediates the peer sent)
// chains to this peer's CAs for the given use.
func (p *Peer) verifyChain(certs []*x509.Certificate, usage x509.ExtKeyUsage) bool {
	pool := p.Pool()
	if len(certs) == 0 || pool == nil {
		return false
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	return err == nil
}

// tlsBase is what both ends of the hop share: TLS 1.3 only, maximum-size
// records from the first byte (the stream is bulk, not interactive), and
// no session tickets: a ticket the server sends after the handshake would
// be read, and buffered with what follows it, by the client's TLS layer,
// which authenticated mode leaves after the preamble.
func tlsBase(cert tls.Certificate, get func() (*tls.Certificate, error)) *tls.Config {
	cfg := &tls.Config{
		MinVersion:                  tls.VersionTLS13,
		DynamicRecordSizingDisabled: true,
		SessionTicketsDisabled:      true,
	}
	if get == nil {
		cfg.Certificates = []tls.Certificate{cert}
		return cfg
	}
	// A reloaded certificate serves the next handshake, as server and as
	// client alike.
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return get() }
	return cfg
}

// Dialer is the source end of the hop: it opens a stream to a peer proxy
// for one migration port.
type Dialer struct {
	// Cert is this proxy's certificate (client and server use); GetCert,
	// if set, is asked instead at every handshake (a certwatcher's, so a
	// renewed certificate is used without a restart).
	Cert    tls.Certificate
	GetCert func() (*tls.Certificate, error)
	// Mode is the hop mode this proxy asks for.
	Mode hop.Mode
	// Timeout bounds connect, handshake, preamble and verdict; zero means
	// DefaultHandshakeTimeout.
	Timeout time.Duration
	// LocalAddr, if set, is the address the hop connections leave from
	// (the proxy's crosscluster0 address).
	LocalAddr net.Addr
	// VerdictWait bounds the wait for the peer's verdict once the preamble
	// is sent: the peer binds the migration, may queue the stream behind
	// its cap, then dials its virt-handler before it answers. Zero means
	// VerdictWait(DefaultQueueWait, DefaultDialTimeout), what a peer with
	// the default settings may take.
	VerdictWait time.Duration
}

// VerdictWait is how long a source waits for the verdict of a peer whose
// streams queue up to queueWait and dial for up to dialTimeout: never less
// than the peer may legitimately take, so a queued stream is not given up
// while it is about to be accepted.
func VerdictWait(queueWait, dialTimeout time.Duration) time.Duration {
	return DefaultHandshakeTimeout/2 + orDefault(queueWait, DefaultQueueWait) + orDefault(dialTimeout, DefaultDialTimeout) + time.Second
}

// Dial connects to peer, authenticates both sides and asks for the stream
// of (route, port). It returns the connection the stream continues
// on: the *tls.Conn in tls mode, the plain *net.TCPConn in authenticated
// mode (so the relay splices).
func (d *Dialer) Dial(ctx context.Context, peer *Peer, route hop.Route, port uint16) (net.Conn, error) {
	timeout := d.timeout()
	pre, err := hop.Preamble{Mode: d.Mode, Route: route, Port: port}.MarshalBinary()
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, addr := range peer.Addresses {
		c, err := d.dialOne(ctx, peer, addr, pre, timeout)
		if err == nil {
			return c, nil
		}
		var ref *hop.RefusedError
		if errors.As(err, &ref) {
			return nil, err // the peer answered: another address will not think otherwise
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("peer %s has no addresses", peer.Name)
	}
	return nil, fmt.Errorf("no address of peer %s accepted the stream: %w", peer.Name, errors.Join(errs...))
}

// handshake connects to one address of peer and authenticates both sides;
// the connection's deadline is ctx's until the caller clears it. records
// (nil off TCP) tells what the TLS layer has read past its records.
func (d *Dialer) handshake(ctx context.Context, peer *Peer, addr string) (tc *tls.Conn, raw net.Conn, records *recordConn, err error) {
	nd := net.Dialer{LocalAddr: d.LocalAddr}
	raw, err = nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, nil, err
	}
	deadline, _ := ctx.Deadline()
	_ = raw.SetDeadline(deadline)
	cfg := tlsBase(d.Cert, d.GetCert)
	cfg.RootCAs = peer.Pool()
	cfg.ServerName = peer.serverName()
	under, records := underTLS(raw)
	tc = tls.Client(under, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, nil, nil, fmt.Errorf("TLS handshake with peer %s: %w", peer.Name, err)
	}
	if records != nil {
		records.authenticated()
	}
	return tc, raw, records, nil
}

func (d *Dialer) timeout() time.Duration {
	if d.Timeout > 0 {
		return d.Timeout
	}
	return DefaultHandshakeTimeout
}

func (d *Dialer) dialOne(ctx context.Context, peer *Peer, addr string, pre []byte, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tc, raw, records, err := d.handshake(ctx, peer, addr)
	if err != nil {
		return nil, err
	}
	if _, err := tc.Write(pre); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("sending the preamble: %w", err)
	}
	var conn net.Conn = tc
	if d.Mode == hop.ModeAuthenticated {
		// The verdict and the stream are plain bytes on raw: TLS must
		// not have read any of them (the peer sends none before it has
		// our preamble, which follows the handshake).
		if records != nil && records.unread() > 0 {
			_ = raw.Close()
			return nil, fmt.Errorf("peer %s: %w", peer.Name, errUnreadAfterPreamble)
		}
		conn = raw
	}
	_ = raw.SetDeadline(time.Now().Add(orDefault(d.VerdictWait, VerdictWait(0, 0))))
	if err := hop.ReadVerdict(conn); err != nil {
		_ = raw.Close()
		return nil, err
	}
	_ = raw.SetDeadline(time.Time{})
	return conn, nil
}
