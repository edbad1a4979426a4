package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
)

// VMMutateHandler is the mutating webhook for VirtualMachines and
// VirtualMachineInstances. It decodes the object once, runs the mutator chain
// on it and answers with one JSON patch.
type VMMutateHandler struct {
	// Kind is chain.KindVM or chain.KindVMI.
	Kind     chain.Kind
	Config   *config.Source
	Facts    lookup.Facts
	Mutators []chain.VMMutator
}

// Handle implements admission.Handler.
func (h *VMMutateHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	return h.handleView(ctx, req, nil)
}

func (h *VMMutateHandler) newView() any { return newVMView(h.Kind) }

func (h *VMMutateHandler) releaseView(view any) { releaseVMView(view) }

func (h *VMMutateHandler) handleView(ctx context.Context, req admission.Request, view any) admission.Response {
	return Serve(ctx, "mutate-"+kindName(h.Kind), req, func(ctx context.Context, req admission.Request) admission.Response {
		return h.mutate(ctx, req, view)
	})
}

func (h *VMMutateHandler) mutate(ctx context.Context, req admission.Request, view any) (resp admission.Response) {
	cr, shape, early := chainRequest(ctx, h.Kind, &req, h.Config, h.Facts, true, view)
	if early != nil {
		return *early
	}
	regions := cr.Regions()
	before := snapshot(regions)
	if err := chain.RunVMMutators(ctx, cr, h.Mutators); err != nil {
		return errorResponse(ctx, err, cr.Warnings)
	}
	if len(cr.Changes) == 0 {
		// Most requests (KubeVirt's own updates, VMs already mutated) end
		// here, having paid for one decode and the small region copies.
		resp = admission.Allowed("")
		resp.Warnings = cr.Warnings
		return resp
	}
	if shape.duplicate != nil {
		return shape.duplicate.refusal()
	}
	ops, err := vmPatch(req.Object.Raw, shape, regions, before)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("computing the JSON patch of %s: %w", h.Kind, err))
	}
	// What kvnet changed is on the object itself (kvnet.io/mutations);
	// the line is for debugging, not paid for on every admitted VM.
	if log := logf.FromContext(ctx).V(1); log.Enabled() {
		log.Info("mutated", "changes", cr.Changes)
	}
	resp = admission.Patched("", ops...)
	resp.Warnings = cr.Warnings
	return resp
}

// errorResponse keeps the two error classes apart. A chain.Refusal is the
// user's mistake and goes back as its 4xx status, field paths included.
// Anything else is kvnet failing at its own work, even when it wraps an API
// status from kvnet's own reads and writes (its RBAC's 403, a 404 or 429 on a
// claim lookup): a 500 whose message says what kvnet was doing, logged here
// and counted by Serve as outcome "error".
func errorResponse(ctx context.Context, err error, warnings []string) admission.Response {
	var refusal *chain.Refusal
	if errors.As(err, &refusal) {
		s := refusal.Status()
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &s, Warnings: warnings}}
	}
	logf.FromContext(ctx).Error(err, "kvnet failed to admit the object")
	resp := admission.Errored(http.StatusInternalServerError, fmt.Errorf("kvnet failed, not the object: %w", err))
	resp.Warnings = warnings
	return resp
}
