package validators

import (
	"context"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/migrationid"
)

// MigrationRoutes checks the two annotations that let a VM move to
// another namespace or name across clusters (migrationid.AnnotationTarget
// on a sending VMIM, migrationid.AnnotationSource on a receiving one), so
// that a typo is a clear refusal when the VMIM is created rather than a
// migration the proxy holds back. Each belongs to one end only: a
// receiving VMIM does not name its receiver, a sending one approves no
// sender. Later changes are not admitted here; the proxy reads the
// annotations again and holds back a migration whose route does not parse.
type MigrationRoutes struct{}

// Name implements chain.MigrationValidator.
func (MigrationRoutes) Name() string { return "migration-routes" }

// ValidateMigration implements chain.MigrationValidator.
func (MigrationRoutes) ValidateMigration(_ context.Context, req *chain.MigrationRequest) (field.ErrorList, error) {
	m := req.Migration
	annotations := field.NewPath("metadata", "annotations")
	var errs field.ErrorList
	if v, ok := m.Annotations[migrationid.AnnotationTarget]; ok {
		p := annotations.Key(migrationid.AnnotationTarget)
		if m.Spec.SendTo == nil {
			errs = append(errs, field.Forbidden(p, "only a sending VirtualMachineInstanceMigration (spec.sendTo) names the VM that receives it"))
		} else if _, _, err := migrationid.ParseVM(v); err != nil {
			errs = append(errs, field.Invalid(p, v, "want <namespace>/<name> of the receiving VM in the peer cluster: "+err.Error()))
		}
	}
	if v, ok := m.Annotations[migrationid.AnnotationSource]; ok {
		p := annotations.Key(migrationid.AnnotationSource)
		if m.Spec.Receive == nil {
			errs = append(errs, field.Forbidden(p, "only a receiving VirtualMachineInstanceMigration (spec.receive) approves the VM that sends to it"))
		} else if _, _, _, err := migrationid.ParseApproval(v); err != nil {
			errs = append(errs, field.Invalid(p, v, "want <peer>/<namespace>/<name> of the sending VM: "+err.Error()))
		}
	}
	return errs, nil
}
