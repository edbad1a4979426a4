package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
)

// Endpoint is where a receiving migration's stream goes in this cluster:
// the target virt-handler's in-cluster address and the ports its
// targetState announces, and the receiving VMIM it was found through (the
// binding lasts as long as that VMIM).
type Endpoint struct {
	Address   string
	Ports     map[string]int
	Migration types.NamespacedName
	UID       types.UID
}

// Resolver finds the in-flight receiving migration of route in this
// cluster: a VMIM with spec.receive.migrationID in the route's target
// namespace, for its target VM, that takes peer's source VM (see Route).
// ok is false when there is none; err only when the lookup itself failed
// or the receiving VMIM does not take the route (a *ResolveError).
type Resolver interface {
	Resolve(ctx context.Context, peer string, route hop.Route) (ep Endpoint, ok bool, err error)
}

// TargetServer is the target end of the hop: it accepts streams from peer
// proxies and relays each to the endpoint its migration announces. It
// dials only addresses that a receiving migration of its own cluster
// announces, never one a peer names, so it is no open relay.
type TargetServer struct {
	// Cert is this proxy's certificate; GetCert, if set, is asked instead
	// at every handshake (see Dialer.GetCert).
	Cert    tls.Certificate
	GetCert func() (*tls.Certificate, error)
	// Peers are the trusted peer proxies; a stream is accepted only from a
	// certificate that chains to one of their CAs.
	Peers []*Peer
	// Modes are the hop modes accepted; empty means both.
	Modes []hop.Mode
	// Resolver looks up receiving migrations.
	Resolver Resolver
	// Limiter caps concurrent migrations (shared with the source side).
	Limiter *Limiter
	// HandshakeTimeout bounds the handshake and preamble; DialTimeout the
	// dial to the target virt-handler; IdleTimeout a stream with no bytes.
	HandshakeTimeout, DialTimeout, IdleTimeout time.Duration
	// Log receives stream events and refusals.
	Log logr.Logger
	// OnRefused, if set, is called with each refusal (tests observe them).
	OnRefused func(peer string, r hop.RefusalCode)
	// CAs stores the KubeVirt CA bundles peers offer; nil refuses them.
	CAs CAReceiver
	// Identities takes the network identities of migrations peers send
	// here; nil refuses them (identity-exchange-off). The Resolver must
	// also be a ReceiverFinder.
	Identities IdentityReceiver
	// Holders answers peers' lease checks: whether the VM a migration
	// moved here still exists; nil refuses them (identity-exchange-off).
	Holders VMHolders
	// Bindings tie each migration to the first peer that presents it; nil
	// keeps them in this process's memory (tests only: a new leader would
	// not know them). kvnet proxy passes a BindingStore.
	Bindings Bindings
	// MaxPendingHandshakes caps the connections not yet authenticated;
	// one more closes the oldest of them (refusal too-many-handshakes,
	// see handshakes for why not the newcomer). Zero means
	// DefaultMaxPendingHandshakes.
	MaxPendingHandshakes int
	// HandshakeRate and HandshakeBurst bound the connections one source
	// address may open (per second, and at once after a quiet spell); one
	// more is closed before the handshake (refusal handshake-rate). Zero
	// means DefaultHandshakeRate, DefaultHandshakeBurst.
	HandshakeRate  float64
	HandshakeBurst int
	// CAOfferEvery and CAOfferBurst bound one peer's CA offers (refusal
	// ca-offer-rate); zero means DefaultCAOfferEvery, DefaultCAOfferBurst.
	CAOfferEvery time.Duration
	CAOfferBurst int

	pending  handshakes
	rateOnce sync.Once
	bySource *keyedLimiter
	caOffers *keyedLimiter
}

func (s *TargetServer) limiters() (bySource, caOffers *keyedLimiter) {
	s.rateOnce.Do(func() {
		r, b := s.HandshakeRate, s.HandshakeBurst
		if r <= 0 {
			r = DefaultHandshakeRate
		}
		if b <= 0 {
			b = DefaultHandshakeBurst
		}
		s.bySource = newKeyedLimiter(rate.Limit(r), b)
		every, cb := orDefault(s.CAOfferEvery, DefaultCAOfferEvery), s.CAOfferBurst
		if cb <= 0 {
			cb = DefaultCAOfferBurst
		}
		s.caOffers = newKeyedLimiter(rate.Every(every), cb)
	})
	return s.bySource, s.caOffers
}

// sourceOf is the rate-limit key of a client: its IP, whatever its port.
func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return a.String()
}

// DefaultMaxPendingHandshakes bounds what unauthenticated clients can make
// the hop listener hold, however many connections arrive. A handshake
// stalled after its ClientHello holds about 36 KiB (20 KiB of heap:
// crypto/tls's state of a half-done handshake and handshakeRecvBuf; and
// its goroutine's 16 KiB stack), one stalled after a byte about 13 KiB
// (5 KiB and an 8 KiB stack), measured after a GC: about 9 MiB
// at the cap, and about 21 MiB more peak RSS with the garbage collector's
// headroom (TestStalledHandshakesBesideAMigration), well inside the
// chart's 256Mi.
const DefaultMaxPendingHandshakes = 256

// Serve accepts hop connections on ln until ctx ends, with the accept
// discipline of every kvnet listener (see serveListener).
func (s *TargetServer) Serve(ctx context.Context, ln net.Listener) error {
	if s.Bindings == nil {
		s.Bindings = &memoryBindings{}
	}
	return serveListener(ctx, ln, s.Log, s.withinRate, func(ctx context.Context, c net.Conn) { s.handle(ctx, c) })
}

// withinRate is the accept loop's filter: a source past its handshake
// rate is closed before any goroutine or TLS state exists for it.
func (s *TargetServer) withinRate(c net.Conn) bool {
	bySource, _ := s.limiters()
	if bySource.allow(sourceOf(c.RemoteAddr()), time.Now()) {
		return true
	}
	s.refuse(s.Log.WithValues("client", c.RemoteAddr().String()), "", hop.RefusedHandshakeRate, nil)
	return false
}

func (s *TargetServer) tlsConfig() *tls.Config {
	cfg := tlsBase(s.Cert, s.GetCert)
	// The chain is checked against each peer's own CAs below, so that the
	// peer is known by name, not merely as "some trusted CA".
	cfg.ClientAuth = tls.RequestClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return &handshakeRefusal{hop.RefusedNoCertificate}
		}
		if s.peerOf(cs.PeerCertificates) == nil {
			return &handshakeRefusal{hop.RefusedUntrustedPeer}
		}
		return nil
	}
	return cfg
}

type handshakeRefusal struct{ r hop.RefusalCode }

func (e *handshakeRefusal) Error() string { return "peer certificate refused: " + e.r.String() }

// peerOf is the configured peer a client certificate names: its chain must
// verify against that peer's CAs and its leaf must carry the peer's name
// (serverName, default name: its one certificate serves and dials) as a
// DNS or URI SAN. A CA that signs for several peers (an organisation
// CA) or for other workloads no longer makes its every leaf that peer.
func (s *TargetServer) peerOf(certs []*x509.Certificate) *Peer {
	for _, p := range s.Peers {
		if namesPeer(certs[0], p.serverName()) && p.verifyChain(certs, x509.ExtKeyUsageClientAuth) {
			return p
		}
	}
	return nil
}

// namesPeer reports whether the leaf carries name as a DNS SAN or as a
// URI SAN (the whole URI, or its host).
func namesPeer(leaf *x509.Certificate, name string) bool {
	if slices.Contains(leaf.DNSNames, name) {
		return true
	}
	for _, u := range leaf.URIs {
		if u.String() == name || u.Host == name {
			return true
		}
	}
	return false
}

func (s *TargetServer) refuse(log logr.Logger, peer string, r hop.RefusalCode, err error) {
	refused.WithLabelValues("target", r.String()).Inc()
	if err != nil {
		log.Info("refused a stream", "peer", peer, "reason", r.String(), "error", err.Error())
	} else {
		log.Info("refused a stream", "peer", peer, "reason", r.String())
	}
	if s.OnRefused != nil {
		s.OnRefused(peer, r)
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (s *TargetServer) handle(ctx context.Context, raw net.Conn) {
	defer raw.Close()
	log := s.Log.WithValues("client", raw.RemoteAddr().String())
	tc, records, ok := s.handshake(ctx, log, raw)
	if !ok {
		return
	}
	peer := s.peerOf(tc.ConnectionState().PeerCertificates)
	log = log.WithValues("peer", peer.Name)
	req, err := hop.ReadRequest(tc)
	if err != nil {
		s.refuse(log, peer.Name, hop.RefusedBadPreamble, err)
		return
	}
	switch {
	case req.CAOffer != nil:
		s.receiveCAs(ctx, log, peer, tc, req.CAOffer)
	case req.Identity != nil:
		s.receiveIdentity(ctx, log, peer, tc, req.Identity)
	case req.Lease != nil:
		s.answerLease(ctx, log, peer, tc, req.Lease)
	default:
		s.relayStream(ctx, log, peer, raw, tc, records, *req.Stream)
	}
}

// handshake runs the mutual-TLS handshake of a hop connection within the
// handshake timeout and the cap on pending handshakes, refusing (counted
// and logged) a connection that fails it or is displaced by newer ones.
func (s *TargetServer) handshake(ctx context.Context, log logr.Logger, raw net.Conn) (*tls.Conn, *recordConn, bool) {
	limit := s.MaxPendingHandshakes
	if limit <= 0 {
		limit = DefaultMaxPendingHandshakes
	}
	pending := s.pending.begin(raw, limit)
	_ = raw.SetDeadline(time.Now().Add(orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout)))
	under, records := underTLS(raw)
	tc := tls.Server(under, s.tlsConfig())
	err := tc.HandshakeContext(ctx)
	if s.pending.end(pending) {
		s.refuse(log, "", hop.RefusedTooManyHandshakes, errDisplaced)
		return nil, nil, false
	}
	if err != nil {
		var hr *handshakeRefusal
		if errors.As(err, &hr) {
			s.refuse(log, "", hr.r, nil)
		} else {
			s.refuse(log, "", hop.RefusedHandshake, err)
		}
		return nil, nil, false
	}
	if records != nil {
		records.authenticated()
	}
	return tc, records, true
}

// relayStream answers a stream request: it finds the receiving migration
// the route names, binds it to the peer, waits for a slot, dials the
// target virt-handler and relays, or refuses with the verdict byte on the
// channel the source reads it from.
func (s *TargetServer) relayStream(ctx context.Context, log logr.Logger, peer *Peer, raw net.Conn, tc *tls.Conn, records *recordConn, pre hop.Preamble) {
	log = log.WithValues("migrationID", pre.MigrationID, "source", pre.Source.String(), "target", pre.Target.String(), "port", pre.Port, "mode", pre.Mode.String())
	// Refusals travel back on the channel the source reads its verdict on.
	verdict := net.Conn(tc)
	if pre.Mode == hop.ModeAuthenticated {
		verdict = raw
		// The source sends nothing after its preamble until it has the
		// verdict; bytes TLS already buffered would be lost to the splice.
		if records != nil && records.unread() > 0 {
			s.refuse(log, peer.Name, hop.RefusedBadPreamble, errUnreadAfterPreamble)
			return
		}
	}
	deny := func(r hop.RefusalCode, err error) {
		s.refuse(log, peer.Name, r, err)
		_, _ = verdict.Write([]byte{byte(r)})
	}
	if !s.modeAllowed(pre.Mode) {
		deny(hop.RefusedMode, nil)
		return
	}
	ep, ok, err := s.Resolver.Resolve(ctx, peer.Name, pre.Route)
	if r, err := lookupVerdict(ok, err); r != hop.Accepted {
		deny(r, err)
		return
	}
	port := strconv.Itoa(int(pre.Port))
	if _, ok := ep.Ports[port]; !ok {
		deny(hop.RefusedPort, nil)
		return
	}
	// Durable before the verdict: no replica can accept another peer for
	// this migration once this one has said "accepted".
	// A store that cannot answer (its cache never synced, the API is away)
	// is a counted refusal, not a hang: half the handshake timeout, which
	// the source's wait for the verdict spans, so the source still hears it.
	bctx, cancel := context.WithTimeout(ctx, orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout)/2)
	bound, err := s.Bindings.Bind(bctx, store.Binding{MigrationID: pre.MigrationID, Peer: peer.Name,
		Namespace: ep.Migration.Namespace, VMIM: ep.Migration.Name, UID: ep.UID})
	cancel()
	if r, err := bindVerdict(bound, err); r != hop.Accepted {
		deny(r, err)
		return
	}
	// The stream may now wait for a slot and then for the dial: the
	// deadline covers both, or a queued stream would time out in the queue
	// (the source waits as long, see VerdictWait).
	dialTimeout := orDefault(s.DialTimeout, DefaultDialTimeout)
	_ = raw.SetDeadline(time.Now().Add(s.Limiter.QueueWait() + dialTimeout + time.Second))
	if s.Limiter != nil {
		if err := s.Limiter.Acquire(ctx, ep.Migration.Namespace, pre.MigrationID); err != nil {
			deny(overCapRefusal(err), err)
			return
		}
		defer s.Limiter.Release(pre.MigrationID)
	}
	target := net.JoinHostPort(ep.Address, port)
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	var d net.Dialer
	dst, err := d.DialContext(dctx, "tcp", target)
	cancel()
	if err != nil {
		dialErrors.Inc()
		deny(hop.RefusedTargetUnreachable, err)
		return
	}
	defer dst.Close()
	if _, err := verdict.Write([]byte{byte(hop.Accepted)}); err != nil {
		log.Info("the peer went away before the stream started", "error", err.Error())
		return
	}
	_ = raw.SetDeadline(time.Time{})
	conn := net.Conn(tc)
	if pre.Mode == hop.ModeAuthenticated {
		conn = raw
	}
	log.Info("relaying a stream from a peer proxy", "target", target)
	runStream(ctx, log, "target", pre.MigrationID, s.IdleTimeout, conn, dst)
}

// lookupVerdict is the refusal, if any, that a migration lookup's outcome
// calls for (accepted when the migration was found).
func lookupVerdict(found bool, err error) (hop.RefusalCode, error) {
	var re *ResolveError
	switch {
	case errors.As(err, &re):
		return re.Reason, re.Err
	case err != nil:
		return hop.RefusedLookup, err
	case !found:
		return hop.RefusedUnknownMigration, nil
	}
	return hop.Accepted, nil
}

// bindVerdict is the refusal, if any, of binding a migration to a peer.
func bindVerdict(bound bool, err error) (hop.RefusalCode, error) {
	switch {
	case err != nil:
		return hop.RefusedLookup, err
	case !bound:
		return hop.RefusedOtherPeer, nil
	}
	return hop.Accepted, nil
}

func (s *TargetServer) modeAllowed(m hop.Mode) bool {
	if len(s.Modes) == 0 {
		return true
	}
	for _, a := range s.Modes {
		if a == m {
			return true
		}
	}
	return false
}

// runStream relays one accepted stream with live per-migration counters
// and logs its end.
func runStream(ctx context.Context, log logr.Logger, side, migrationID string, idle time.Duration, client, target net.Conn) {
	connections.Inc()
	active.Inc()
	defer active.Dec()
	counters := migrationCounters(side, migrationID)
	defer counters.release()
	st := &stream{log: log, idle: idle, onBytes: counters.add}
	up, down := st.pump(ctx, client, target)
	log.Info("stream ended", "bytesToTarget", up, "bytesFromTarget", down)
}

// ErrNoPeer is returned when no configured peer serves a migration.
var ErrNoPeer = errors.New("no configured peer proxy for this migration")

// PeerFor picks the peer of a migration from its spec.sendTo.connectURL:
// the peer whose ConnectHosts hold the URL's host, or the only peer.
func PeerFor(peers []*Peer, connectURL string) (*Peer, error) {
	host := connectURL
	if h, _, err := net.SplitHostPort(connectURL); err == nil {
		host = h
	}
	for _, p := range peers {
		for _, h := range p.ConnectHosts {
			if h == host {
				return p, nil
			}
		}
	}
	if len(peers) == 1 && len(peers[0].ConnectHosts) == 0 {
		return peers[0], nil
	}
	return nil, fmt.Errorf("%w (connectURL %q)", ErrNoPeer, connectURL)
}
