package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"gomodules.xyz/jsonpatch/v2"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/lookup"
	"github.com/kvnet/kvnet/metrics"
	"github.com/kvnet/kvnet/patch"
)

// VMMutator is the mutating webhook for VirtualMachines and
// VirtualMachineInstances. It decodes the object once, runs the mutator chain
// on it and answers with one JSON patch.
type VMMutator struct {
	// Kind is chain.KindVM or chain.KindVMI.
	Kind     string
	Config   *config.Source
	Facts    lookup.Facts
	Mutators []chain.Mutator
}

// Handle implements admission.Handler.
func (h *VMMutator) Handle(ctx context.Context, req admission.Request) (resp admission.Response) {
	name := "mutate-" + h.Kind
	start := time.Now()
	log := logf.FromContext(ctx).WithValues("webhook", name, "namespace", req.Namespace, "name", req.Name, "uid", req.UID)
	defer func() {
		if p := recover(); p != nil {
			log.Error(fmt.Errorf("%v", p), "handler panicked")
			resp = admission.Errored(http.StatusInternalServerError, fmt.Errorf("kvnet %s failed unexpectedly; see the kvnet logs for uid %s", name, req.UID))
		}
		observe(name, start, resp)
	}()
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	obj, cr, err := decodeVMish(h.Kind, req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	fillRequest(cr, &req.AdmissionRequest)
	cr.Config, cr.Facts = h.Config.Get(), h.Facts
	if reason := chain.SkipReason(cr); reason != "" {
		log.V(1).Info("skipped", "reason", reason)
		return admission.Allowed(reason)
	}
	if h.Kind == chain.KindVMI && ownedByVM(cr.Meta) {
		return admission.Allowed("spec comes from a VirtualMachine kvnet already mutated")
	}
	ctx = logf.IntoContext(ctx, log)
	if err := chain.RunMutators(ctx, cr, h.Mutators); err != nil {
		return errorResponse(err, cr.Warnings)
	}
	if len(cr.Changes) == 0 {
		// Most requests (KubeVirt's own updates, VMs already mutated) end
		// here, having paid for one decode and no encoding or diff.
		resp = admission.Allowed("")
		resp.Warnings = cr.Warnings
		return resp
	}
	ops, err := h.diff(req.Object.Raw, obj)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	log.Info("mutated", "changes", cr.Changes)
	resp = admission.Patched("", ops...)
	resp.Warnings = cr.Warnings
	return resp
}

// diff encodes the original (decoded again from raw: cheaper than a deep copy
// taken up front for the requests that change nothing) and the mutated object,
// and returns the one patch between them.
func (h *VMMutator) diff(raw []byte, mutated any) ([]jsonpatch.Operation, error) {
	orig, _, err := decodeVMish(h.Kind, raw)
	if err != nil {
		return nil, err
	}
	before, err := json.Marshal(orig)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", h.Kind, err)
	}
	after, err := json.Marshal(mutated)
	if err != nil {
		return nil, fmt.Errorf("encoding mutated %s: %w", h.Kind, err)
	}
	return patch.Compute(raw, before, after)
}

// errorResponse tells a user's mistake (an API status error such as Invalid)
// from kvnet's own failure.
func errorResponse(err error, warnings []string) admission.Response {
	var status apierrors.APIStatus
	if errors.As(err, &status) && status.Status().Code < 500 {
		s := status.Status()
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &s, Warnings: warnings}}
	}
	resp := admission.Errored(http.StatusInternalServerError, err)
	resp.Warnings = warnings
	return resp
}

// observe counts the outcome of one request.
func observe(webhook string, start time.Time, resp admission.Response) {
	outcome := "allowed"
	switch {
	case resp.Result != nil && resp.Result.Code >= 500:
		outcome = "error"
	case !resp.Allowed && resp.Result != nil && resp.Result.Code == http.StatusBadRequest:
		outcome = "bad-request"
	case !resp.Allowed:
		outcome = "denied"
	case len(resp.Patches) > 0:
		outcome = "patched"
	}
	metrics.Requests.WithLabelValues(webhook, outcome).Inc()
	metrics.RequestLatency.WithLabelValues(webhook).Observe(time.Since(start).Seconds())
}
