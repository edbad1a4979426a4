package chain

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
)

// KindVMIM is the kind the migration validators check.
const KindVMIM Kind = "VirtualMachineInstanceMigration"

// MigrationRequest is one VirtualMachineInstanceMigration under admission.
type MigrationRequest struct {
	Operation admissionv1.Operation
	Namespace string
	Name      string
	// Migration is the object being admitted, read only.
	Migration *kubevirtv1.VirtualMachineInstanceMigration

	Config *config.Config
	Facts  lookup.Facts

	// Warnings are returned to the client as admission warnings.
	Warnings []string
}

// Warn adds an admission warning.
func (r *MigrationRequest) Warn(format string, args ...any) {
	r.Warnings = append(r.Warnings, fmt.Sprintf(format, args...))
}

// Invalid builds the 422 a user gets, one cause per field, as for a VM.
func (r *MigrationRequest) Invalid(errs field.ErrorList) error {
	return RefuseInvalid(schema.GroupKind{Group: kubevirtv1.GroupVersion.Group, Kind: string(KindVMIM)}, r.Name, errs)
}

// MigrationValidator checks a VirtualMachineInstanceMigration. As for a
// Validator, field errors are the user's to fix and an error is kvnet's own
// failure (a lookup).
type MigrationValidator interface {
	Name() string
	ValidateMigration(ctx context.Context, req *MigrationRequest) (field.ErrorList, error)
}
