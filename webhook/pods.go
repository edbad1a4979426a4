package webhook

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/apijson"
	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/lookup"
	"github.com/kvnet/kvnet/patch"
)

// PodMutator is a mutating webhook for pods. Its webhook configuration
// selects the pods (objectSelector on KubeVirt's labels), so it never sees a
// pod that is not KubeVirt's.
//
// Pod mutators read a pod's metadata and where it runs, and write only its
// labels and annotations. So the handler decodes just that part of the pod
// (no containers, volumes or managedFields) and builds the patch from the
// keys the mutators changed: a launcher pod's whole answer is usually one
// replace of /metadata/annotations/k8s.v1.cni.cncf.io~1networks.
type PodMutator struct {
	// Name labels metrics and logs, e.g. "launcher-pods".
	Name     string
	Config   *config.Source
	Facts    lookup.Facts
	Mutators []chain.PodMutator
}

// Handle implements admission.Handler.
func (h *PodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	return h.handleView(ctx, req, nil)
}

func (h *PodMutator) newView() any { return new(podView) }

func (h *PodMutator) handleView(ctx context.Context, req admission.Request, view any) admission.Response {
	return Serve(ctx, "mutate-"+h.Name, req, func(ctx context.Context, req admission.Request) admission.Response {
		return h.mutatePod(ctx, req, view)
	})
}

func (h *PodMutator) mutatePod(ctx context.Context, req admission.Request, view any) (resp admission.Response) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	pod, present, err := decodePodView(req.Object.Raw, view)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	pr := &chain.PodRequest{
		Operation: req.Operation,
		Namespace: req.Namespace,
		Pod:       pod,
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
		old, _, err := decodePodView(req.OldObject.Raw, nil)
		if err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("the old pod: %w", err))
		}
		pr.OldPod = old
	}
	annotations, labels := maps.Clone(pod.Annotations), maps.Clone(pod.Labels)
	containers, volumes := entryNames(pod.Spec.Containers, containerName), entryNames(pod.Spec.Volumes, volumeName)
	if err := chain.RunPodMutators(ctx, pr, h.Mutators); err != nil {
		return errorResponse(ctx, err, pr.Warnings)
	}
	// Mutators may only append containers and volumes; a changed entry
	// would be lost, since the patch adds only what is new.
	if !slices.Equal(containers, entryNames(pod.Spec.Containers[:min(len(containers), len(pod.Spec.Containers))], containerName)) ||
		!slices.Equal(volumes, entryNames(pod.Spec.Volumes[:min(len(volumes), len(pod.Spec.Volumes))], volumeName)) {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("a pod mutator changed the pod's existing containers or volumes; they may only append"))
	}
	ops := podOps(present, annotations, labels, pod)
	ops = append(ops, specOps(present, pod, len(containers), len(volumes))...)
	if len(ops) > 0 {
		logf.FromContext(ctx).V(1).Info("mutated pod", "operations", len(ops))
	}
	resp = admission.Patched("", ops...)
	resp.Warnings = pr.Warnings
	return resp
}

// podOps is the patch for what the mutators changed in the pod's labels and
// annotations (before: annotations, labels). A pod without metadata gets
// it added whole.
func podOps(present podPresence, annotations, labels map[string]string, pod *corev1.Pod) []jsonpatch.Operation {
	if !present.metadata {
		meta := map[string]any{}
		if len(pod.Annotations) > 0 {
			meta["annotations"] = pod.Annotations
		}
		if len(pod.Labels) > 0 {
			meta["labels"] = pod.Labels
		}
		if len(meta) == 0 {
			return nil
		}
		return []jsonpatch.Operation{{Operation: "add", Path: "/metadata", Value: meta}}
	}
	ops := patch.StringMap("/metadata/annotations", present.annotations, annotations, pod.Annotations)
	return append(ops, patch.StringMap("/metadata/labels", present.labels, labels, pod.Labels)...)
}

// specOps adds the containers and volumes the mutators appended (the pod
// had nc containers and nv volumes): one add at the end of each list per
// new entry, the list whole where the pod lacks it, or spec whole where it
// lacks spec.
func specOps(present podPresence, pod *corev1.Pod, nc, nv int) []jsonpatch.Operation {
	newC, newV := pod.Spec.Containers[nc:], pod.Spec.Volumes[nv:]
	if len(newC) == 0 && len(newV) == 0 {
		return nil
	}
	if !present.spec {
		spec := map[string]any{}
		if len(newC) > 0 {
			spec["containers"] = newC
		}
		if len(newV) > 0 {
			spec["volumes"] = newV
		}
		return []jsonpatch.Operation{{Operation: "add", Path: "/spec", Value: spec}}
	}
	var ops []jsonpatch.Operation
	appendTo := func(path string, had bool, items []any) {
		if len(items) == 0 {
			return
		}
		if !had {
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: path, Value: items})
			return
		}
		for _, it := range items {
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: path + "/-", Value: it})
		}
	}
	appendTo("/spec/containers", present.containers, anys(newC))
	appendTo("/spec/volumes", present.volumes, anys(newV))
	return ops
}

func anys[T any](s []T) []any {
	out := make([]any, len(s))
	for i := range s {
		out[i] = s[i]
	}
	return out
}

func entryNames[T any](s []T, name func(*T) string) []string {
	out := make([]string, len(s))
	for i := range s {
		out[i] = name(&s[i])
	}
	return out
}

func containerName(c *corev1.Container) string { return c.Name }
func volumeName(v *corev1.Volume) string       { return v.Name }

// podView is the part of a pod the pod mutators read. Decoding only this
// skips the containers, volumes and managedFields that make up most of a
// virt-launcher pod; unknown and unread fields stay in the request's object,
// which the patch leaves alone.
type podView struct {
	Metadata *objectMeta `json:"metadata"`
	Spec     *struct {
		NodeName string           `json:"nodeName"`
		Affinity *corev1.Affinity `json:"affinity"`
		// Of containers and volumes only what a sidecar injection needs
		// to stay idempotent: names, and the mounts it copies.
		Containers []struct {
			Name         string               `json:"name"`
			VolumeMounts []corev1.VolumeMount `json:"volumeMounts"`
		} `json:"containers"`
		Volumes []struct {
			Name string `json:"name"`
		} `json:"volumes"`
	} `json:"spec"`
}

// podPresence tells which members the admitted pod has (not missing, not
// null), so the patch adds a map or list whole where the pod lacks it.
type podPresence struct{ metadata, annotations, labels, spec, containers, volumes bool }

// decodePodView decodes the part of raw the pod mutators read into a
// corev1.Pod, whose other fields stay empty, or takes it from view, the
// Edge's decode of it (see viewHandler).
func decodePodView(raw []byte, view any) (*corev1.Pod, podPresence, error) {
	if len(raw) == 0 {
		return nil, podPresence{}, fmt.Errorf("the request carries no pod")
	}
	// json.Unmarshal takes null for an empty pod; a patch for it would not apply.
	if !apijson.IsObject(raw) {
		return nil, podPresence{}, fmt.Errorf("the request's pod is not a JSON object")
	}
	v, _, err := decodeView[podView](raw, false, view)
	if err != nil {
		return nil, podPresence{}, fmt.Errorf("decoding Pod: %w", err)
	}
	pod := &corev1.Pod{}
	var present podPresence
	if sp := v.Spec; sp != nil {
		pod.Spec.NodeName, pod.Spec.Affinity = sp.NodeName, sp.Affinity
		for _, c := range sp.Containers {
			pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: c.Name, VolumeMounts: c.VolumeMounts})
		}
		for _, vol := range sp.Volumes {
			pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol.Name})
		}
		present.spec, present.containers, present.volumes = true, sp.Containers != nil, sp.Volumes != nil
	}
	if v.Metadata == nil {
		return pod, present, nil
	}
	pod.ObjectMeta = v.Metadata.objectMeta()
	present.metadata, present.annotations, present.labels = true, v.Metadata.Annotations != nil, v.Metadata.Labels != nil
	return pod, present, nil
}
