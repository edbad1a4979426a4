package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/lookup"
	"github.com/kvnet/kvnet/patch"
)

// PodMutator is a mutating webhook for pods. Its webhook configuration
// selects the pods (objectSelector on KubeVirt's labels), so it never sees a
// pod that is not KubeVirt's.
type PodMutator struct {
	// Name labels metrics and logs, e.g. "launcher-pods".
	Name     string
	Config   *config.Source
	Facts    lookup.Facts
	Mutators []chain.PodMutator
}

// Handle implements admission.Handler.
func (h *PodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return Serve(ctx, "mutate-"+h.Name, req, h.mutatePod)
}

func (h *PodMutator) mutatePod(ctx context.Context, req admission.Request) (resp admission.Response) {
	log := logf.FromContext(ctx)
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	if len(req.Object.Raw) == 0 {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("the request carries no pod"))
	}
	// json.Unmarshal takes null for an empty pod; a patch for it would not apply.
	if t := bytes.TrimLeft(req.Object.Raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("the request's pod is not a JSON object"))
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding Pod: %w", err))
	}
	pr := &chain.PodRequest{
		Operation: req.Operation,
		Namespace: req.Namespace,
		Pod:       &pod,
		DryRun:    req.DryRun != nil && *req.DryRun,
		Config:    h.Config.Get(),
		Facts:     h.Facts,
	}
	if pr.Namespace == "" {
		pr.Namespace = pod.Namespace
	}
	if pr.Config.Excluded(pr.Namespace) {
		return admission.Allowed("namespace is excluded by config")
	}
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		var old corev1.Pod
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the old Pod: %w", err))
		}
		pr.OldPod = &old
	}
	before, err := json.Marshal(&pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding Pod: %w", err))
	}
	if err := chain.RunPodMutators(ctx, pr, h.Mutators); err != nil {
		return errorResponse(err, pr.Warnings)
	}
	after, err := json.Marshal(&pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("encoding mutated Pod: %w", err))
	}
	ops, err := patch.Compute(req.Object.Raw, before, after)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if len(ops) > 0 {
		log.V(1).Info("mutated pod", "operations", len(ops))
	}
	resp = admission.Patched("", ops...)
	resp.Warnings = pr.Warnings
	return resp
}
