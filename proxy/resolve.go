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

// Resolve implements Resolver.
func (r *ClusterResolver) Resolve(ctx context.Context, id string) (Endpoint, bool, error) {
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := r.Reader.List(ctx, &list); err != nil {
		return Endpoint{}, false, fmt.Errorf("listing VirtualMachineInstanceMigrations: %w", err)
	}
	for i := range list.Items {
		m := &list.Items[i]
		if m.Spec.Receive == nil || m.Spec.Receive.MigrationID != id || m.IsFinal() || m.DeletionTimestamp != nil {
			continue
		}
		var vmi kubevirtv1.VirtualMachineInstance
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: m.Spec.VMIName}, &vmi); err != nil {
			return Endpoint{}, false, client.IgnoreNotFound(err)
		}
		ms := vmi.Status.MigrationState
		if ms == nil || ms.TargetState == nil || ms.TargetState.NodeAddress == nil || *ms.TargetState.NodeAddress == "" {
			return Endpoint{}, false, nil // the target has not announced its endpoint yet
		}
		return Endpoint{Address: *ms.TargetState.NodeAddress, Ports: maps.Clone(ms.TargetState.DirectMigrationNodePorts),
			Migration: client.ObjectKeyFromObject(m), UID: m.UID}, true, nil
	}
	return Endpoint{}, false, nil
}
