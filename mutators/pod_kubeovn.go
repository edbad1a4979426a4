package mutators

import (
	"cmp"
	"context"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/kubeovn"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// KubeOVNPod completes kube-ovn annotations on virt-launcher pods.
//
// KubeVirt copies VMI annotations to the launcher pod (it drops only
// kubectl.kubernetes.io/* and its observed-api-version keys), so what the
// KubeOVN mutator writes on the template normally arrives by itself. This
// mutator covers what that path misses: VMs created before kvnet was
// installed, or before legacyLiveMigration was turned on, still get
// allow_live_migration on every kube-ovn attachment of their next pod (a
// migration target pod above all), which is when kube-ovn <= 1.12 needs it.
type KubeOVNPod struct{}

// Name implements chain.PodMutator.
func (KubeOVNPod) Name() string { return "kube-ovn-pod" }

// MutatePod implements chain.PodMutator.
func (KubeOVNPod) MutatePod(ctx context.Context, req *chain.PodRequest) error {
	if !req.Config.KubeOVN.LegacyLiveMigration || req.Pod.Annotations[chain.SkipAnnotation] == "true" {
		return nil
	}
	elems, err := multus.Parse(req.Pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		// The pod is KubeVirt's; a broken annotation is not ours to refuse.
		req.Warn("kvnet cannot read %s: %v", multus.NetworksAnnotation, err)
		return nil
	}
	for _, e := range elems {
		ref, err := netattach.ParseRef(cmp.Or(e.Namespace(), req.Namespace) + "/" + e.Name())
		if err != nil {
			continue
		}
		info, err := req.Facts.NAD(ctx, ref)
		if err != nil {
			return err
		}
		if info == nil || !info.IsKubeOVN() {
			continue
		}
		key := info.KubeOVNProvider() + kubeovn.AllowLiveMigration
		if _, ok := req.Pod.Annotations[key]; !ok {
			req.Pod.Annotations[key] = "true"
		}
	}
	return nil
}
