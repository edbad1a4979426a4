package validators

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/migrationid"
)

// MigrationIDs refuses a VirtualMachineInstanceMigration whose decentralized
// migration ID another live VMIM of the same role already holds, in any
// namespace of the cluster: a second receiving VMIM with a receiving
// VMIM's spec.receive.migrationID, a second sending one with a sending
// VMIM's spec.sendTo.migrationID. The ID is all a peer names: a tenant who
// copies a victim's ID into a VMIM of its own would otherwise make the
// victim's migration ambiguous (the proxy refuses it for both, as
// ambiguous-migration) or, in a cluster without kvnet's proxy, leave
// KubeVirt's synchronization controller to pick one. A send and a receive
// VMIM may share an ID: both ends of a migration can be in one cluster.
// Live is migrationid.Live (not Succeeded or Failed, not being deleted): a
// migration that ended frees its ID.
//
// The holders come from the informer cache (lookup.Facts), so two VMIMs
// created at once with one ID, or one created before the cache saw the
// other, may both be admitted. That race is accepted: the proxy refuses a
// receiving ID that two live VMIMs hold (proxy.ClusterResolver), for both,
// so a race can stall the victim's migration until one of the two ends but
// never hand its stream to the copy.
type MigrationIDs struct{}

// Name implements chain.MigrationValidator.
func (MigrationIDs) Name() string { return "migration-ids" }

// ValidateMigration implements chain.MigrationValidator.
func (MigrationIDs) ValidateMigration(ctx context.Context, req *chain.MigrationRequest) (field.ErrorList, error) {
	// The VMIM being created holds its IDs whatever phase its body claims:
	// the API server drops a new VMIM's status (a status subresource), and
	// a tenant must not skip the check by writing one.
	m := req.Migration
	var errs field.ErrorList
	for _, role := range migrationid.Roles {
		id := migrationid.ID(m, role)
		if id == "" {
			continue
		}
		holders, err := req.Facts.MigrationHolders(ctx, role, id)
		if err != nil {
			return nil, err
		}
		// Holders in the requester's own namespace are named; one in
		// another namespace is not: a tenant guessing IDs must not learn
		// which VMIMs other tenants run.
		var others []string
		elsewhere := false
		for _, h := range holders {
			switch {
			case h.Namespace == m.Namespace && h.Name == m.Name:
			case h.Namespace == m.Namespace:
				others = append(others, "live migration "+h.Name)
			default:
				elsewhere = true
			}
		}
		if elsewhere {
			others = append(others, "a live migration in another namespace")
		}
		if len(others) > 0 {
			errs = append(errs, field.Invalid(role.Path(), id,
				"already used by "+strings.Join(others, ", ")+
					": a migration ID names one "+roleName(role)+" VirtualMachineInstanceMigration of the cluster until it has succeeded or failed"))
		}
	}
	return errs, nil
}

// roleName says which VMIMs share a role, for messages.
func roleName(r migrationid.Role) string {
	if r == migrationid.Receive {
		return "receiving"
	}
	return "sending"
}
