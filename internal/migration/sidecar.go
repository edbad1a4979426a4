package migration

import (
	"context"
	"fmt"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/kvnet/kvnet/internal/chain"
)

// SidecarMutatorName names the sidecar mutator in metrics and errors.
const SidecarMutatorName = "migration-proxy-sidecar"

// TokenMountPath is where the API server's ServiceAccount admission mounts
// the pod's token into each container.
const TokenMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// Sidecar is the pod mutator of the migration-pods webhook that injects the
// migration proxy (`kvnet proxy`) into the synchronization controllers'
// pods (config migration.proxySidecar). The container and its volumes come
// from config, so it makes no API call.
//
// It acts on CREATE only: a pod's containers cannot change afterwards, and
// an UPDATE must never add or remove one. A pod that already has a
// container of the sidecar's name is left as it is, so a reinvocation, or
// a second kvnet replica's webhook after the first, adds nothing. It
// changes pods only: the Deployment stays exactly as virt-operator wrote
// it, so virt-operator's reconcile has nothing to undo, and each pod the
// ReplicaSet creates from it gets the sidecar here again.
type Sidecar struct{}

// Name implements chain.PodMutator.
func (Sidecar) Name() string { return SidecarMutatorName }

// MutatePod implements chain.PodMutator.
func (Sidecar) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	if req.Operation != admissionv1.Create || req.Config == nil {
		return nil
	}
	ps := req.Config.Migration.Sidecar(req.Pod.Labels)
	if ps == nil {
		return nil
	}
	// The sidecar goes only where the cross-cluster addresses do: a pod
	// that only looks like a synchronization controller gets neither.
	if nets, err := holderNetworks(ctx, req, false); err != nil || len(nets) == 0 {
		return err
	}
	spec := &req.Pod.Spec
	for _, c := range spec.Containers {
		if c.Name == ps.Container.Name {
			return nil // already injected
		}
	}
	have := map[string]bool{}
	for _, v := range spec.Volumes {
		have[v.Name] = true
	}
	for _, v := range ps.Volumes {
		if have[v.Name] {
			// Not kvnet's failure and not the pod's: the operator's
			// volume names clash with the pod's. Refused, so that the
			// ReplicaSet's FailedCreate events say why, rather than a
			// sidecar that mounts someone else's volume.
			sidecarRefused.WithLabelValues("volume-name-taken").Inc()
			return chain.RefuseForbidden(fmt.Sprintf("migration.proxySidecar.volumes: the pod already has a volume %q; rename the sidecar's volume in kvnet's config", v.Name))
		}
	}
	c := *ps.Container.DeepCopy()
	if _, mounted := mountAt(c.VolumeMounts, TokenMountPath); !mounted {
		if m, ok := tokenMount(spec.Containers); ok {
			c.VolumeMounts = append(c.VolumeMounts, m)
		}
	}
	spec.Containers = append(spec.Containers, c)
	for _, v := range ps.Volumes {
		spec.Volumes = append(spec.Volumes, *v.DeepCopy())
	}
	sidecarInjected.Inc()
	logf.FromContext(ctx).V(1).Info("injected the migration proxy sidecar", "container", c.Name)
	return nil
}

// tokenMount is the ServiceAccount token mount of the pod's containers, if
// any has one: the API server's ServiceAccount admission runs before the
// webhooks, so it mounted the token only into the containers it saw.
func tokenMount(cs []corev1.Container) (corev1.VolumeMount, bool) {
	for _, c := range cs {
		if m, ok := mountAt(c.VolumeMounts, TokenMountPath); ok {
			return m, true
		}
	}
	return corev1.VolumeMount{}, false
}

// mountAt is the mount of ms at path, if there is one.
func mountAt(ms []corev1.VolumeMount, path string) (corev1.VolumeMount, bool) {
	i := slices.IndexFunc(ms, func(m corev1.VolumeMount) bool { return m.MountPath == path })
	if i < 0 {
		return corev1.VolumeMount{}, false
	}
	return ms[i], true
}
