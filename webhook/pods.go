package webhook

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/patch"
)

// PodMutateHandler is a mutating webhook for pods. Its webhook configuration
// selects the pods (objectSelector on KubeVirt's labels), so it never sees a
// pod that is not KubeVirt's.
//
// Pod mutators read a pod's metadata and where it runs, and write its
// labels and annotations, append containers and volumes, and (recording it,
// chain.PodRequest.Record) add to the node selector and the containers'
// resources. So the handler decodes just that part of the pod (of the
// containers names, mounts and resources; no managedFields) and builds the
// patch from what the mutators changed: a launcher pod's whole answer is
// usually one replace of /metadata/annotations/k8s.v1.cni.cncf.io~1networks.
type PodMutateHandler struct {
	// Name labels metrics and logs: MetricMutateLauncherPod or
	// MetricMutateMigrationPod.
	Name     string
	Config   *config.Source
	Facts    lookup.Facts
	Mutators []chain.PodMutator
}

// Handle implements admission.Handler.
func (h *PodMutateHandler) Handle(ctx context.Context, req admission.Request) admission.Response {
	return h.handleView(ctx, req, nil)
}

func (h *PodMutateHandler) newView() any { return new(podView) }

// releaseView leaves the view to the collector: a pod's is small.
func (h *PodMutateHandler) releaseView(any) {}

func (h *PodMutateHandler) handleView(ctx context.Context, req admission.Request, view any) admission.Response {
	return Serve(ctx, h.Name, req, func(ctx context.Context, req admission.Request) admission.Response {
		return h.mutatePod(ctx, req, view)
	})
}

func (h *PodMutateHandler) mutatePod(ctx context.Context, req admission.Request, view any) (resp admission.Response) {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	pod, present, err := decodePodView(req.Object.Raw, view, podPatchMembers)
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
	// Unlike a VM's, a pod with a duplicate member is refused before the
	// mutators run, not only when there is a patch: the migration-pods
	// mutator reserves an address (writes its allocation) on the way to
	// its patch, and a refusal after it would leave that reservation held
	// until it expires.
	if present.duplicate != nil {
		return present.duplicate.refusal()
	}
	if req.Operation == admissionv1.Update && len(req.OldObject.Raw) > 0 {
		old, _, err := decodePodView(req.OldObject.Raw, nil, nil)
		if err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("the old pod: %w", err))
		}
		pr.OldPod = old
	}
	annotations, labels := patch.Snapshot(pod.Annotations), patch.Snapshot(pod.Labels)
	containers, volumes := entryNames(pod.Spec.Containers, containerName), entryNames(pod.Spec.Volumes, volumeName)
	resources := copyResources(&pod.Spec)
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
	if len(pr.Changes) > 0 && present.spec {
		ops = append(ops, resourceOps(present, resources, &pod.Spec)...)
	}
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
func podOps(present podPresence, annotations, labels patch.Entries, pod *corev1.Pod) []jsonpatch.Operation {
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
	ops := patch.StringMapSince("/metadata/annotations", present.annotations, annotations, pod.Annotations)
	return append(ops, patch.StringMapSince("/metadata/labels", present.labels, labels, pod.Labels)...)
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

// podResources is what the pod mutators may change in the pod's spec
// besides appending containers and volumes, as it was before them: the node
// selector and the existing containers' resources.
type podResources struct {
	nodeSelector     map[string]string
	requests, limits []corev1.ResourceList
}

func copyResources(s *corev1.PodSpec) podResources {
	c := podResources{nodeSelector: maps.Clone(s.NodeSelector)}
	if len(s.Containers) > 0 {
		c.requests, c.limits = make([]corev1.ResourceList, len(s.Containers)), make([]corev1.ResourceList, len(s.Containers))
		for i := range s.Containers {
			c.requests[i], c.limits[i] = maps.Clone(s.Containers[i].Resources.Requests), maps.Clone(s.Containers[i].Resources.Limits)
		}
	}
	return c
}

// resourceOps is the patch for what the mutators changed in the pod's node
// selector and its existing containers' resources (before: the copy taken
// before them; appended containers are added whole by specOps). Like the
// annotations, a member the pod lacks is added whole; a resource or label
// is added, replaced or removed by its own key. Mutators record such a
// change (chain.PodRequest.Record); unrecorded, it is not looked for.
func resourceOps(present podPresence, before podResources, after *corev1.PodSpec) []jsonpatch.Operation {
	ops := patch.StringMap("/spec/nodeSelector", present.nodeSelector, before.nodeSelector, after.NodeSelector)
	for i := range before.requests {
		r := &after.Containers[i].Resources
		base := "/spec/containers/" + strconv.Itoa(i) + "/resources"
		if !present.resources[i] {
			res := map[string]map[string]string{}
			if len(r.Requests) > 0 {
				res["requests"] = quantities(r.Requests)
			}
			if len(r.Limits) > 0 {
				res["limits"] = quantities(r.Limits)
			}
			if len(res) > 0 {
				ops = append(ops, jsonpatch.Operation{Operation: "add", Path: base, Value: res})
			}
			continue
		}
		ops = append(ops, patch.StringMap(base+"/requests", present.requests[i], quantities(before.requests[i]), quantities(r.Requests))...)
		ops = append(ops, patch.StringMap(base+"/limits", present.limits[i], quantities(before.limits[i]), quantities(r.Limits))...)
	}
	return ops
}

// quantities is a resource list as the API writes it: each quantity in its
// canonical string form.
func quantities(l corev1.ResourceList) map[string]string {
	if l == nil {
		return nil
	}
	out := make(map[string]string, len(l))
	for k, q := range l {
		out[string(k)] = q.String()
	}
	return out
}

// podView is the part of a pod the pod mutators read. Decoding only this
// skips the containers, volumes and managedFields that make up most of a
// virt-launcher pod; unknown and unread fields stay in the request's object,
// which the patch leaves alone.
type podView struct {
	Metadata *objectMeta `json:"metadata"`
	Spec     *struct {
		NodeName     string            `json:"nodeName"`
		Affinity     *corev1.Affinity  `json:"affinity"`
		NodeSelector map[string]string `json:"nodeSelector"`
		// ServiceAccountName says who made the pod: the migration steps
		// give addresses only to KubeVirt's own accounts.
		ServiceAccountName string `json:"serviceAccountName"`
		// Of containers and volumes only what a sidecar injection needs
		// to stay idempotent (names, and the mounts it copies) and the
		// resources mutators.NetworkResources adds to.
		Containers []struct {
			Name         string               `json:"name"`
			VolumeMounts []corev1.VolumeMount `json:"volumeMounts"`
			Resources    *struct {
				Requests corev1.ResourceList `json:"requests"`
				Limits   corev1.ResourceList `json:"limits"`
			} `json:"resources"`
		} `json:"containers"`
		Volumes []struct {
			Name string `json:"name"`
		} `json:"volumes"`
	} `json:"spec"`
}

// podPresence tells which members the admitted pod has (not missing, not
// null), so the patch adds a map or list whole where the pod lacks it.
// The per-container slices are indexed like spec.containers.
type podPresence struct {
	metadata, annotations, labels, spec, containers, volumes, nodeSelector bool
	resources, requests, limits                                            []bool
	// duplicate names a member of podPatchMembers that the pod gives
	// twice, if any (see unmarshalNoting).
	duplicate *duplicateMember
}

// podPatchMembers are the field paths, in the strict decoder's notation
// with list indexes as "[]" (see withoutIndexes), of the members the pod
// patch addresses (podOps, specOps, resourceOps) and of their parents. A
// duplicate of one would let the patch add or replace a key that only the
// first copy has: the decode merges the copies, a JSON patch sees the last.
var podPatchMembers = map[string]bool{
	"metadata": true, "metadata.annotations": true, "metadata.labels": true,
	"spec": true, "spec.nodeSelector": true, "spec.containers": true, "spec.volumes": true,
	"spec.containers[].resources": true, "spec.containers[].resources.requests": true, "spec.containers[].resources.limits": true,
}

// decodePodView decodes the part of raw the pod mutators read into a
// corev1.Pod, whose other fields stay empty, or takes it from view, the
// Edge's decode of it (see viewHandler). members, if not nil, are the
// members whose duplicates it notes in podPresence.duplicate: the admitted
// pod's, which the patch applies to, not the old pod's.
func decodePodView(raw []byte, view any, members map[string]bool) (*corev1.Pod, podPresence, error) {
	if len(raw) == 0 {
		return nil, podPresence{}, fmt.Errorf("the request carries no pod")
	}
	// json.Unmarshal takes null for an empty pod; a patch for it would not apply.
	if !apijson.IsObject(raw) {
		return nil, podPresence{}, fmt.Errorf("the request's pod is not a JSON object")
	}
	v, dups, err := decodeView[podView](raw, members, view)
	if err != nil {
		return nil, podPresence{}, fmt.Errorf("decoding Pod: %w", err)
	}
	pod := &corev1.Pod{}
	present := podPresence{duplicate: dups}
	if sp := v.Spec; sp != nil {
		pod.Spec.NodeName, pod.Spec.Affinity, pod.Spec.NodeSelector = sp.NodeName, sp.Affinity, sp.NodeSelector
		pod.Spec.ServiceAccountName = sp.ServiceAccountName
		present.nodeSelector = sp.NodeSelector != nil
		n := len(sp.Containers)
		present.resources, present.requests, present.limits = make([]bool, n), make([]bool, n), make([]bool, n)
		for i, c := range sp.Containers {
			pc := corev1.Container{Name: c.Name, VolumeMounts: c.VolumeMounts}
			if r := c.Resources; r != nil {
				pc.Resources = corev1.ResourceRequirements{Requests: r.Requests, Limits: r.Limits}
				present.resources[i], present.requests[i], present.limits[i] = true, r.Requests != nil, r.Limits != nil
			}
			pod.Spec.Containers = append(pod.Spec.Containers, pc)
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
