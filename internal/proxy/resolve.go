package proxy

import (
	"context"
	"fmt"
	"maps"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// ClusterResolver resolves receiving migrations from this cluster's
// objects (the proxy's informer cache, which must have the
// migrationid.IndexField index): the in-flight VMIM with
// spec.receive.migrationID, and the target endpoint its VMI's
// status.migrationState.targetState announces. The VMI CRD has no status
// subresource, so whoever may create the VMI can write that status: the
// node it names is looked up in kvnet's own allocations (Handlers), and
// the proxy dials only the address kvnet gave that node's virt-handler,
// which the announced address must equal.
type ClusterResolver struct {
	Reader client.Reader
	// Handlers tells the address kvnet allocated to a node's virt-handler
	// (migration.HandlerAddresses); nil refuses every stream.
	Handlers interface {
		HandlerAddress(ctx context.Context, node string) (netip.Addr, bool, error)
	}
}

// ResolveError is a migration the resolver found but must not dial; the
// target refuses the stream with Reason.
type ResolveError struct {
	Reason hop.RefusalCode
	Err    error
}

func (e *ResolveError) Error() string { return e.Reason.String() + ": " + e.Err.Error() }
func (e *ResolveError) Unwrap() error { return e.Err }

// Resolve implements Resolver. The receiving VMIM is looked for in the
// route's target namespace only, so a copy of the ID in any other
// namespace is never seen, and must receive the route's target VM from
// its source (approves). Two live receiving VMIMs of the ID in that
// namespace are refused for both: the ID is what a peer names, and list
// order must not decide whose a stream is. kvnet's admission refuses a
// second live holder of an ID in a namespace (validators.MigrationIDs);
// this refusal still stops two created at once, or while admission was
// down. The announced ports must be KubeVirt's (CheckMigrationPorts).
func (r *ClusterResolver) Resolve(ctx context.Context, peer string, rt hop.Route) (Endpoint, bool, error) {
	m, err := r.receiving(ctx, peer, rt)
	if m == nil || err != nil {
		return Endpoint{}, false, err
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.VMIName}, &vmi); err != nil {
		return Endpoint{}, false, client.IgnoreNotFound(err)
	}
	ms := vmi.Status.MigrationState
	if ms == nil || ms.TargetState == nil || ms.TargetState.NodeAddress == nil || *ms.TargetState.NodeAddress == "" {
		return Endpoint{}, false, nil // the target has not announced its endpoint yet
	}
	if err := CheckMigrationPorts(ms.TargetState.DirectMigrationNodePorts); err != nil {
		return Endpoint{}, false, &ResolveError{Reason: hop.RefusedBadPorts, Err: err}
	}
	addr, err := r.handlerAddress(ctx, ms.TargetState.Node, *ms.TargetState.NodeAddress)
	if err != nil {
		return Endpoint{}, false, err
	}
	return Endpoint{Address: addr.String(), Ports: maps.Clone(ms.TargetState.DirectMigrationNodePorts),
		Migration: client.ObjectKeyFromObject(m), UID: m.UID}, true, nil
}

// Receiver implements ReceiverFinder, with Resolve's rules.
func (r *ClusterResolver) Receiver(ctx context.Context, peer string, rt hop.Route) (types.NamespacedName, types.UID, bool, error) {
	m, err := r.receiving(ctx, peer, rt)
	if m == nil || err != nil {
		return types.NamespacedName{}, "", false, err
	}
	return client.ObjectKeyFromObject(m), m.UID, true, nil
}

// receiving is the one live receiving VMIM of rt's migration ID in rt's
// target namespace, nil when there is none, ambiguous-migration when two
// hold it there and wrong-namespace-or-vm when it does not take rt from
// peer.
func (r *ClusterResolver) receiving(ctx context.Context, peer string, rt hop.Route) (*kubevirtv1.VirtualMachineInstanceMigration, error) {
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := r.Reader.List(ctx, &list, client.InNamespace(rt.Target.Namespace),
		client.MatchingFields{migrationid.IndexField: migrationid.Key(migrationid.Receive, rt.MigrationID)}); err != nil {
		return nil, fmt.Errorf("listing the live receiving VirtualMachineInstanceMigrations of migration ID %q in %s: %w", rt.MigrationID, rt.Target.Namespace, err)
	}
	switch len(list.Items) {
	case 0:
		return nil, nil
	case 1:
	default:
		a, b := &list.Items[0], &list.Items[1]
		return nil, &ResolveError{Reason: hop.RefusedAmbiguousMigration,
			Err: fmt.Errorf("receiving VMIMs %s/%s and %s/%s both carry migration ID %q", a.Namespace, a.Name, b.Namespace, b.Name, rt.MigrationID)}
	}
	m := &list.Items[0]
	if err := approves(m, peer, rt); err != nil {
		return nil, &ResolveError{Reason: hop.RefusedWrongVM, Err: err}
	}
	return m, nil
}

// handlerAddress is the address to dial for a target on node: kvnet's
// allocation for that node's virt-handler, when the status announces
// exactly it.
func (r *ClusterResolver) handlerAddress(ctx context.Context, node, announced string) (netip.Addr, error) {
	notHandler := func(format string, a ...any) (netip.Addr, error) {
		return netip.Addr{}, &ResolveError{Reason: hop.RefusedTargetNotHandler, Err: fmt.Errorf(format, a...)}
	}
	if r.Handlers == nil {
		return notHandler("this proxy has no view of kvnet's virt-handler addresses")
	}
	addr, ok, err := r.Handlers.HandlerAddress(ctx, node)
	switch {
	case err != nil:
		return netip.Addr{}, err
	case !ok:
		return notHandler("kvnet gave no virt-handler on node %q an in-cluster migration address", node)
	}
	if got, err := netip.ParseAddr(announced); err != nil || got.Unmap() != addr.Unmap() {
		return notHandler("the announced target %q is not %s, the address kvnet gave the virt-handler on node %q", announced, addr, node)
	}
	return addr, nil
}
