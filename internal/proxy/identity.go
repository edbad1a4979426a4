package proxy

import (
	"context"
	"errors"
	"net"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvnet/kvnet/internal/proxy/hop"
	"github.com/kvnet/kvnet/internal/proxy/store"
)

// IdentityReceiver takes a migration's network identity for the receiving
// VMIM it belongs to: it checks it against this cluster (network names,
// subnets, IPs in use, the target pod not yet there) and stores it where
// the target pod's admission finds it. A check that fails is an
// *IdentityRefusal; any other error is the store's.
type IdentityReceiver interface {
	ReceiveIdentity(ctx context.Context, peer string, vmim types.NamespacedName, id hop.Identity) error
}

// IdentityRefusal is an identity this cluster cannot honour; the source
// hears Reason and the migration does not start.
type IdentityRefusal struct {
	Reason hop.RefusalCode
	Err    error
}

func (e *IdentityRefusal) Error() string { return e.Reason.String() + ": " + e.Err.Error() }
func (e *IdentityRefusal) Unwrap() error { return e.Err }

// ReceiverFinder finds the live receiving VMIM of a route, as Resolver
// does, without waiting for its target endpoint: an identity travels
// before the target pod, and so its endpoint, exists. ClusterResolver
// implements it.
type ReceiverFinder interface {
	Receiver(ctx context.Context, peer string, route hop.Route) (vmim types.NamespacedName, uid types.UID, ok bool, err error)
}

// receiveIdentity answers a peer's identity offer. Only a receiving VMIM
// of this cluster with that migration ID takes one, and only from the
// peer the migration is bound to: the first peer to present the ID, by
// identity or by stream, holds it (Bindings), so no other peer can give
// the receiving VM other addresses. The VMIM must be the route's target
// and take its source (Route): a refusal there binds nothing and writes
// nothing.
func (s *TargetServer) receiveIdentity(ctx context.Context, log logr.Logger, peer *Peer, conn net.Conn, id *hop.Identity) {
	log = log.WithValues("request", "identity", "migrationID", id.MigrationID, "source", id.Source.String(), "target", id.Target.String())
	deny := func(r hop.RefusalCode, err error) {
		s.refuse(log, peer.Name, r, err)
		_, _ = conn.Write([]byte{byte(r)})
	}
	finder, ok := s.Resolver.(ReceiverFinder)
	if s.Identities == nil || !ok {
		deny(hop.RefusedIdentityOff, nil)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout))
	defer cancel()
	vmim, uid, found, err := finder.Receiver(ctx, peer.Name, id.Route)
	if r, err := lookupVerdict(found, err); r != hop.Accepted {
		deny(r, err)
		return
	}
	bound, err := s.Bindings.Bind(ctx, store.Binding{MigrationID: id.MigrationID, Peer: peer.Name, Namespace: vmim.Namespace, VMIM: vmim.Name, UID: uid})
	if r, err := bindVerdict(bound, err); r != hop.Accepted {
		deny(r, err)
		return
	}
	var ir *IdentityRefusal
	if err := s.Identities.ReceiveIdentity(ctx, peer.Name, vmim, *id); errors.As(err, &ir) {
		deny(ir.Reason, ir.Err)
		return
	} else if err != nil {
		deny(hop.RefusedIdentityStore, err)
		return
	}
	log.Info("took a migration's network identity", "peer", peer.Name, "vmim", vmim.String(), "networks", len(id.Networks))
	_, _ = conn.Write([]byte{byte(hop.Accepted)})
}

// OfferIdentity sends id to peer over the hop, inside TLS, and returns
// once the peer answered that it took it (or why not: a *RefusedError).
func (d *Dialer) OfferIdentity(ctx context.Context, peer *Peer, id hop.Identity) error {
	req, err := id.MarshalBinary()
	if err != nil {
		return err
	}
	return d.offer(ctx, peer, req, "the identity")
}
