package app

import (
	"context"
	"fmt"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// persistentIPsPreview lets kvnet mutate print the claims next to the VM
// that causes them.
func persistentIPsPreview(cfg *config.Config, facts lookup.Facts) offline.RelatedFunc {
	return func(ctx context.Context, kind, namespace string, mutated []byte) ([][]byte, error) {
		return persistentips.Offline(ctx, cfg, facts, kind, namespace, mutated)
	}
}

// persistentIPs adds the IPAMClaim controller to the manager and returns
// the launcher-pod steps that reference its claims. Both are always wired; the config switch
// persistentIPs.enabled decides per reconcile and per request, so turning it
// off takes effect on reload and claims are still released.
//
// The IPAMClaim CRD is needed only for persistent IPs: without it and with
// persistentIPs.enabled false, kvnet starts without the controller and the
// launcher-pod references (turning persistent IPs on then needs the CRD and
// a restart). Without it and with persistent IPs on, kvnet refuses to start
// and says which CRD is missing.
func persistentIPs(ctx context.Context, mgr manager.Manager, cfg *config.Source, facts lookup.Facts) (PersistentIPSteps, error) {
	gvk := ipamv1alpha1.SchemeGroupVersion.WithKind("IPAMClaim")
	if _, err := mgr.GetRESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version); meta.IsNoMatchError(err) {
		if cfg.Get().PersistentIPsEnabled() {
			return PersistentIPSteps{}, fmt.Errorf("persistentIPs.enabled is true, but the API server has no %s (CRD ipamclaims.k8s.cni.cncf.io): install it, or set persistentIPs.enabled: false: %w", gvk, err)
		}
		mgr.GetLogger().Info("the IPAMClaim CRD is not installed and persistent IPs are off: the persistent-IP controller is not started; install the CRD and restart kvnet to turn them on")
		return PersistentIPSteps{}, nil
	} else if err != nil {
		return PersistentIPSteps{}, fmt.Errorf("looking up the IPAMClaim kind: %w", err)
	}
	// The MAC check beside a MAC pool asks which VMs received a MAC in a
	// cross-cluster migration: an index on the IPAMClaim informer.
	if r, ok := facts.(*lookup.Reader); ok {
		if err := r.IndexClaimMACs(ctx, mgr.GetFieldIndexer()); err != nil {
			return PersistentIPSteps{}, err
		}
	}
	// Start the informers the pod mutator reads with the manager, so the
	// readiness check waits for them instead of the first pod paying for it.
	for _, obj := range []client.Object{&kubevirtv1.VirtualMachineInstance{}, &ipamv1alpha1.IPAMClaim{}} {
		if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
			return PersistentIPSteps{}, fmt.Errorf("starting informer for %T: %w", obj, err)
		}
	}
	r := &persistentips.Reconciler{Facts: facts, Config: cfg, Events: mgr.GetEventRecorder("kvnet-persistentips")}
	if err := r.SetupWithManager(ctx, mgr); err != nil {
		return PersistentIPSteps{}, fmt.Errorf("persistent IPs controller: %w", err)
	}
	return persistentIPSteps(mgr.GetCache(), mgr.GetAPIReader()), nil
}
