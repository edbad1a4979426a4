package webhook

import (
	"context"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
)

// MigrationValidateHandler is the validating webhook for the
// VirtualMachineInstanceMigrations of decentralized migrations. Its
// registration sends only CREATEs of those with spec.receive or
// spec.sendTo: KubeVirt's virt-api refuses any change to a VMIM's spec
// ("update of Migration object's spec is restricted"), so a migration ID is
// set once, at CREATE, and an ordinary migration (a node drain's) never
// waits on kvnet.
//
// Unlike the VM webhooks it ignores kvnet.io/skip: whoever creates the VMIM
// writes that annotation, and what the validators protect is other
// namespaces' migrations. Namespaces kvnet's config excludes are left
// alone, as everywhere.
type MigrationValidateHandler struct {
	Config     *config.Source
	Facts      lookup.Facts
	Validators []chain.MigrationValidator
}

// Handle implements admission.Handler.
func (h *MigrationValidateHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	return Serve(ctx, MetricValidateMigration, req, h.validate)
}

func (h *MigrationValidateHandler) validate(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	var m kubevirtv1.VirtualMachineInstanceMigration
	if err := apijson.Unmarshal(req.Object.Raw, &m); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the VirtualMachineInstanceMigration: %w", err))
	}
	if m.Namespace == "" {
		m.Namespace = req.Namespace
	}
	if m.Name == "" {
		m.Name = req.Name
	}
	mr := &chain.MigrationRequest{
		Operation: req.Operation, Namespace: m.Namespace, Name: m.Name, Migration: &m,
		Config: h.Config.Get(), Facts: h.Facts,
	}
	if mr.Config.Excluded(mr.Namespace) {
		return admission.Allowed("namespace is excluded by config")
	}
	errs, err := chain.RunMigrationValidators(ctx, mr, h.Validators)
	if err != nil {
		return errorResponse(ctx, err, mr.Warnings)
	}
	if len(errs) > 0 {
		logf.FromContext(ctx).Info("denied", "errors", errs.ToAggregate().Error())
		return errorResponse(ctx, mr.Invalid(errs), mr.Warnings)
	}
	resp := admission.Allowed("")
	resp.Warnings = mr.Warnings
	return resp
}
