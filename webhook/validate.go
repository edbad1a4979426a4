package webhook

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
)

// VMValidateHandler is the validating webhook for VirtualMachines and standalone
// VirtualMachineInstances (a VMI a VM controls is the VM's business). On UPDATE it ratchets: an error the old object
// already had does not block the update, so a VM whose NAD was deleted can
// still be edited (for example to remove that network).
type VMValidateHandler struct {
	Kind       chain.Kind
	Config     *config.Source
	Facts      lookup.Facts
	Validators []chain.VMValidator
}

// Handle implements admission.Handler.
func (h *VMValidateHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	return h.handleView(ctx, req, nil)
}

func (h *VMValidateHandler) newView() any { return newVMView(h.Kind) }

func (h *VMValidateHandler) releaseView(view any) { releaseVMView(view) }

func (h *VMValidateHandler) handleView(ctx context.Context, req admission.Request, view any) admission.Response {
	return Serve(ctx, "validate-"+kindName(h.Kind), req, func(ctx context.Context, req admission.Request) admission.Response {
		return h.validate(ctx, req, view)
	})
}

func (h *VMValidateHandler) validate(ctx context.Context, req admission.Request, view any) (resp admission.Response) {
	log := logf.FromContext(ctx)
	cr, _, early := chainRequest(ctx, h.Kind, &req, h.Config, h.Facts, false, view)
	if early != nil {
		return *early
	}
	errs, err := chain.RunVMValidators(ctx, cr, h.Validators)
	if err != nil {
		return errorResponse(ctx, err, cr.Warnings)
	}
	if len(errs) > 0 && req.Operation == admissionv1.Update {
		errs = h.ratchet(ctx, cr, &req.AdmissionRequest, errs)
	}
	if len(errs) > 0 {
		log.Info("denied", "errors", errs.ToAggregate().Error())
		return errorResponse(ctx, cr.Invalid(errs), cr.Warnings)
	}
	resp = admission.Allowed("")
	resp.Warnings = cr.Warnings
	return resp
}

// ratchet drops the errors the old object had too. If the old object cannot
// be validated, nothing is dropped.
func (h *VMValidateHandler) ratchet(ctx context.Context, cr *chain.Request, ar *admissionv1.AdmissionRequest, errs field.ErrorList) field.ErrorList {
	old, _, err := decodeVMOrVMI(h.Kind, ar.OldObject.Raw, false, nil)
	if err != nil {
		return errs
	}
	fillRequest(old, ar)
	old.Config, old.Facts = h.Config.Get(), h.Facts
	oldErrs, err := chain.RunVMValidators(ctx, old, h.Validators)
	if err != nil {
		return errs
	}
	seen := map[string]bool{}
	for _, e := range oldErrs {
		seen[ratchetKey(old, e)] = true
	}
	var out field.ErrorList
	for _, e := range errs {
		if !seen[ratchetKey(cr, e)] {
			out = append(out, e)
		}
	}
	return out
}

// ratchetKey names a field error by the network or interface it is about,
// not by its list index: removing or inserting an earlier network shifts
// every index after it, and the errors the VM already had must still be
// recognised as old.
func ratchetKey(r *chain.Request, e *field.Error) string {
	f := e.Field
	nets := r.Spec.Networks
	f = byName(f, r.SpecPath.Child("networks").String(), len(nets), func(i int) string { return nets[i].Name })
	ifaces := r.Spec.Domain.Devices.Interfaces
	f = byName(f, r.SpecPath.Child("domain", "devices", "interfaces").String(), len(ifaces), func(i int) string { return ifaces[i].Name })
	return fmt.Sprintf("%s\x00%s\x00%v\x00%s", e.Type, f, e.BadValue, e.Detail)
}

// byName rewrites list[i] at the start of path f as list[name=...].
func byName(f, list string, n int, name func(int) string) string {
	rest, ok := strings.CutPrefix(f, list+"[")
	if !ok {
		return f
	}
	idx, tail, ok := strings.Cut(rest, "]")
	i, err := strconv.Atoi(idx)
	if !ok || err != nil || i < 0 || i >= n {
		return f
	}
	return list + "[name=" + strconv.Quote(name(i)) + "]" + tail
}
