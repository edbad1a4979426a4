package chain

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/lookup"
	"github.com/kvnet/kvnet/metrics"
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

// RunPodMutators runs ms in order. A panic in one becomes an error naming it.
func RunPodMutators(ctx context.Context, req *PodRequest, ms []PodMutator) error {
	for _, m := range ms {
		if err := runPodMutator(ctx, req, m); err != nil {
			return err
		}
	}
	return nil
}

func runPodMutator(ctx context.Context, req *PodRequest, m PodMutator) (err error) {
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			logf.FromContext(ctx).Error(fmt.Errorf("%v", p), "pod mutator panicked", "mutator", m.Name(), "stack", string(debug.Stack()))
			err = fmt.Errorf("pod mutator %s failed unexpectedly: %v", m.Name(), p)
		}
		metrics.ObserveStep(m.Name(), "Pod", start, err, false)
	}()
	if err := m.MutatePod(ctx, req); err != nil {
		return fmt.Errorf("pod mutator %s: %w", m.Name(), err)
	}
	return nil
}
