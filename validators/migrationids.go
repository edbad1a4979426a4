package validators

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/migrationid"
)

// MigrationIDs refuses a VirtualMachineInstanceMigration whose decentralized
// migration ID another live VMIM of the same role already holds in the same
// namespace: a second receiving VMIM with a receiving VMIM's
// spec.receive.migrationID, a second sending one with a sending VMIM's
// spec.sendTo.migrationID. Two such VMIMs would make the migration
// ambiguous (the proxy refuses it for both, as ambiguous-migration).
//
// VMIMs of other namespaces are neither counted nor named, dry-run or not:
// the migration proxy ties a migration to the sending and the receiving
// VM by namespace and name (proxy.Route), so a copy of a victim's ID in a
// tenant's namespace is never looked at, and a refusal that depended on
// other namespaces would tell a tenant which IDs other tenants use. So an
// ID need not be hard to guess: it names a migration within a namespace,
// it does not decide whose it is. A send and a receive VMIM may share an
// ID: both ends of a migration can be in one cluster. Live is
// migrationid.Live (not Succeeded or Failed, not being deleted): a
// migration that ended frees its ID.
//
// The holders come from the informer cache (lookup.Facts), so two VMIMs
// created at once with one ID, or one created before the cache saw the
// other, may both be admitted. That race is accepted: the proxy refuses a
// receiving ID that two live VMIMs of a namespace hold, for both.
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
		var others []string
		for _, h := range holders {
			if h.Namespace == m.Namespace && h.Name != m.Name {
				others = append(others, "live migration "+h.Name)
			}
		}
		if len(others) > 0 {
			errs = append(errs, field.Invalid(role.Path(), id,
				"already used by "+strings.Join(others, ", ")+
					": a migration ID names one "+roleName(role)+" VirtualMachineInstanceMigration of the namespace until it has succeeded or failed"))
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
