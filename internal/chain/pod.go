package chain

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
)

// PodRequest is one pod under admission: a virt-launcher pod, or a
// virt-handler / synchronization-controller pod that needs a migration address.
type PodRequest struct {
	Operation admissionv1.Operation
	Namespace string
	// Pod is the object being admitted; mutators change it in place.
	Pod *corev1.Pod
	// OldPod is the stored pod on UPDATE, nil otherwise.
	OldPod *corev1.Pod
	// DryRun is true when the API server will not persist the pod: mutators
	// must not write side effects (allocations, claims) for it.
	DryRun bool

	Config *config.Config
	Facts  lookup.Facts

	// Changes is what the mutators changed in the pod's spec, recorded in
	// the pod's kvnet.io/mutations. Labels and annotations need no record:
	// the webhook compares them whole.
	Changes  []Change
	Warnings []string
}

// Warn adds an admission warning.
func (r *PodRequest) Warn(format string, args ...any) {
	r.Warnings = append(r.Warnings, fmt.Sprintf(format, args...))
}

// PodMutator changes a pod in place; it must be idempotent, since the API
// server may reinvoke it and KubeVirt updates launcher pods for NIC hotplug.
type PodMutator interface {
	Name() string
	MutatePod(ctx context.Context, req *PodRequest) error
}
