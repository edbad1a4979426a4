package proxy

import (
	"context"
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ClusterResolver resolves receiving migrations from this cluster's
// objects (the proxy's informer cache): the in-flight VMIM with
// spec.receive.migrationID, and the target endpoint its VMI's
// status.migrationState.targetState announces. The target virt-handler
// writes that endpoint about itself, on the in-cluster migration network;
// nothing a peer sends can change it.
type ClusterResolver struct {
	Reader client.Reader
}

// ResolveError is a migration the resolver found but must not dial; the
// target refuses the stream with Reason.
type ResolveError struct {
	Reason Refusal
	Err    error
}

func (e *ResolveError) Error() string { return e.Reason.String() + ": " + e.Err.Error() }
func (e *ResolveError) Unwrap() error { return e.Err }

// Resolve implements Resolver. A migration ID held by two live receiving
// VMIMs (in any namespaces) is refused for both: the ID is what a peer
// names, and a tenant who copies a victim's ID must neither receive the
// victim's stream nor decide, by list order, whose it is. The announced
// ports must be KubeVirt's (CheckMigrationPorts).
func (r *ClusterResolver) Resolve(ctx context.Context, id string) (Endpoint, bool, error) {
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := r.Reader.List(ctx, &list); err != nil {
		return Endpoint{}, false, fmt.Errorf("listing VirtualMachineInstanceMigrations: %w", err)
	}
	var found *kubevirtv1.VirtualMachineInstanceMigration
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.Receive == nil || m.Spec.Receive.MigrationID != id || m.IsFinal() || m.DeletionTimestamp != nil {
			continue
		}
		if found != nil {
			return Endpoint{}, false, &ResolveError{Reason: RefusedAmbiguousMigration,
				Err: fmt.Errorf("receiving VMIMs %s/%s and %s/%s both carry migration ID %q", found.Namespace, found.Name, m.Namespace, m.Name, id)}
		}
		found = m
	}
	if found == nil {
		return Endpoint{}, false, nil
	}
	m := found
	var vmi kubevirtv1.VirtualMachineInstance
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.VMIName}, &vmi); err != nil {
		return Endpoint{}, false, client.IgnoreNotFound(err)
	}
	ms := vmi.Status.MigrationState
	if ms == nil || ms.TargetState == nil || ms.TargetState.NodeAddress == nil || *ms.TargetState.NodeAddress == "" {
		return Endpoint{}, false, nil // the target has not announced its endpoint yet
	}
	if err := CheckMigrationPorts(ms.TargetState.DirectMigrationNodePorts); err != nil {
		return Endpoint{}, false, &ResolveError{Reason: RefusedBadPorts, Err: err}
	}
	return Endpoint{Address: *ms.TargetState.NodeAddress, Ports: maps.Clone(ms.TargetState.DirectMigrationNodePorts),
		Migration: client.ObjectKeyFromObject(m), UID: m.UID}, true, nil
}
