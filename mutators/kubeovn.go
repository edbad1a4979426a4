package mutators

import (
	"context"
	"strings"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/kubeovn"
)

// KubeOVN writes the per-attachment annotations kube-ovn reads from the
// virt-launcher pod: which NIC gets the default route, and (kube-ovn up to
// v1.12) that the IP may be shared by source and target pod during live
// migration. They go on the VMI template metadata, which KubeVirt copies to
// the VMI and from there to the pod.
type KubeOVN struct{}

// Name implements chain.VMMutator.
func (KubeOVN) Name() string { return "kube-ovn" }

// Mutate implements chain.VMMutator.
func (m KubeOVN) Mutate(ctx context.Context, req *chain.Request) error {
	var onStack [4]string
	legacy := onStack[:0] // networks that carry allow_live_migration
	for _, net := range req.Spec.Networks {
		if net.Multus == nil {
			continue
		}
		info, err := req.NAD(ctx, net.Multus.NetworkName)
		if err != nil {
			return err
		}
		if info == nil || !info.IsKubeOVN() {
			if req.CarriesDefaultRoute(net.Name) {
				req.Warn("network %s asks for the default route, but only kube-ovn attachments honour that; ignored", net.Name)
			}
			continue
		}
		provider := info.KubeOVNProvider()
		changed := false
		if req.CarriesDefaultRoute(net.Name) {
			changed = setAnnotation(req, provider+kubeovn.DefaultRoute, "true") || changed
		}
		liveMigration := provider + kubeovn.AllowLiveMigration
		if req.Config.KubeOVN.LegacyLiveMigration {
			changed = setAnnotation(req, liveMigration, "true") || changed
		}
		if _, ok := req.TemplateMeta.Annotations[liveMigration]; ok {
			legacy = append(legacy, net.Name)
		}
		if changed {
			req.Record(m.Name(), "", net.Name)
		}
	}
	if len(legacy) > 0 {
		// One warning per VM, not per network: kubectl prints each one.
		// Joined rather than formatted: a cluster that keeps the flag has
		// it in every answer to a VM on kube-ovn.
		req.Warnings = append(req.Warnings, "network "+strings.Join(legacy, ", ")+legacyLiveMigrationWarning)
	}
	return nil
}

// legacyLiveMigrationWarning follows "network <names>" in the warning a VM
// gets when kvnet sets, or the user keeps, allow_live_migration.
const legacyLiveMigrationWarning = ": allow_live_migration (kubeOVN.legacyLiveMigration) is read only by kube-ovn <= v1.12; " +
	"kube-ovn >= v1.13 ignores it and keeps the IP through live migration by itself"

// setAnnotation sets a template annotation the user has not set already.
func setAnnotation(req *chain.Request, key, value string) bool {
	if _, ok := req.TemplateMeta.Annotations[key]; ok {
		return false
	}
	if req.TemplateMeta.Annotations == nil {
		req.TemplateMeta.Annotations = map[string]string{}
	}
	req.TemplateMeta.Annotations[key] = value
	return true
}
