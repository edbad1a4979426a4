package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"

	"github.com/kvnet/kvnet/internal/proxy/caexchange"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// CAReceiver stores a configured peer's checked KubeVirt CAs; the hop
// listener calls it for each offer.
type CAReceiver interface {
	ReceiveCAs(ctx context.Context, peer string, certs []*x509.Certificate) error
}

// CAPeers are the configured peers as the CA exchange sees them: the ones
// with addresses are offered the bundle through d.
func CAPeers(peers []*Peer, d *Dialer) []caexchange.Peer {
	out := make([]caexchange.Peer, 0, len(peers))
	for _, p := range peers {
		cp := caexchange.Peer{Name: p.Name}
		if len(p.Addresses) > 0 {
			cp.Offer = func(ctx context.Context, bundle []byte) error { return d.OfferCAs(ctx, p, bundle) }
		}
		out = append(out, cp)
	}
	return out
}

// OfferCAs hands bundle (PEM) to peer over the hop, always inside TLS, and
// returns once the peer answered that it stored it (or why not).
func (d *Dialer) OfferCAs(ctx context.Context, peer *Peer, bundle []byte) error {
	req, err := hop.CAOffer{Bundle: bundle}.MarshalBinary()
	if err != nil {
		return err
	}
	return d.offer(ctx, peer, req, "the CA bundle")
}

// offer sends one request that is answered by a verdict (a CA offer, an
// identity) to the first address of peer that takes it; a refusal ends
// the attempt, since another address of the same peer would say the same.
func (d *Dialer) offer(ctx context.Context, peer *Peer, req []byte, what string) error {
	var errs []error
	for _, addr := range peer.Addresses {
		err := d.offerOne(ctx, peer, addr, req)
		if err == nil {
			return nil
		}
		var ref *hop.RefusedError
		if errors.As(err, &ref) {
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if len(errs) == 0 {
		return fmt.Errorf("peer %s has no addresses", peer.Name)
	}
	return fmt.Errorf("no address of peer %s took %s: %w", peer.Name, what, errors.Join(errs...))
}

func (d *Dialer) offerOne(ctx context.Context, peer *Peer, addr string, req []byte) error {
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	tc, raw, _, err := d.handshake(ctx, peer, addr)
	if err != nil {
		return err
	}
	defer raw.Close()
	if _, err := tc.Write(req); err != nil {
		return fmt.Errorf("sending the CA offer: %w", err)
	}
	return hop.ReadVerdict(tc)
}

// receiveCAs answers a configured peer's CA offer on the hop: check the
// bundle, store it in that peer's slot, and say how it went.
func (s *TargetServer) receiveCAs(ctx context.Context, log logr.Logger, peer *Peer, conn net.Conn, o *hop.CAOffer) {
	log = log.WithValues("request", "ca-offer")
	deny := func(r hop.RefusalCode, err error) {
		s.refuse(log, peer.Name, r, err)
		_, _ = conn.Write([]byte{byte(r)})
	}
	if s.CAs == nil {
		deny(hop.RefusedCAExchangeOff, nil)
		return
	}
	if _, caOffers := s.limiters(); !caOffers.allow(peer.Name, time.Now()) {
		caexchange.CountRefusedOffer(peer.Name, hop.RefusedCAOfferRate)
		deny(hop.RefusedCAOfferRate, nil)
		return
	}
	certs, err := caexchange.ParseCABundle(o.Bundle, time.Now())
	if err != nil {
		caexchange.CountRefusedOffer(peer.Name, hop.RefusedBadCABundle)
		deny(hop.RefusedBadCABundle, err)
		return
	}
	// The verdict must reach the peer before its handshake timeout.
	ctx, cancel := context.WithTimeout(ctx, orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout))
	defer cancel()
	if err := s.CAs.ReceiveCAs(ctx, peer.Name, certs); err != nil {
		deny(hop.RefusedCAStore, err)
		return
	}
	_, _ = conn.Write([]byte{byte(hop.Accepted)})
}
