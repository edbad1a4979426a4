package test

import (
	"context"
	"strings"
	"testing"
	"time"

	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/test/framework"
)

// kvnet needs the IPAMClaim CRD only for persistent IPs. On an API server
// without it, kvnet starts and gets ready with persistentIPs.enabled false,
// and refuses to start, naming the CRD, with it true. (Before, the IPAMClaim
// informer was started unconditionally and NewManager failed with "no
// matches for kind IPAMClaim" whatever the config said.)
func TestStartsWithoutIPAMClaimCRDWhenPersistentIPsAreOff(t *testing.T) {
	assets, err := framework.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	crds, err := framework.CRDPaths()
	if err != nil {
		t.Fatal(err)
	}
	var without []string
	for _, p := range crds {
		if !strings.Contains(p, "ipamclaims") {
			without = append(without, p)
		}
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: without, ErrorIfCRDPathMissing: true}
	restCfg, err := te.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = te.Stop() })
	opts := app.ServeOptions{Port: -1, MetricsAddr: "0", ProbeAddr: "0", TLSMinVersion: "1.2", Namespace: framework.KvnetNamespace, SeveralManagers: true}

	on, err := config.Parse(nil, framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := app.NewManager(context.Background(), restCfg, opts, config.Static(on)); err == nil || !strings.Contains(err.Error(), "ipamclaims.k8s.cni.cncf.io") {
		t.Fatalf("persistent IPs on without the CRD: err = %v, want one naming the CRD", err)
	}

	off, err := config.Parse([]byte("persistentIPs: {enabled: false}\n"), framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := app.NewManager(ctx, restCfg, opts, config.Static(off))
	if err != nil {
		cancel()
		t.Fatalf("persistent IPs off without the CRD: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	syncCtx, stop := context.WithTimeout(context.Background(), 60*time.Second)
	defer stop()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("kvnet's caches never synced without the IPAMClaim CRD")
	}
}

// The KubeVirt CR informer starts with the manager, so the readiness check
// (the manager's caches synced) covers it and no admission request pays for
// its start. Asked for right after start-up, it is already synced; an
// informer created by this call would still be listing. (Before, the first
// request that read the KubeVirt CR started it, inside the webhook timeout.)
func TestKubeVirtInformerStartsWithTheManager(t *testing.T) {
	inf, err := env.Manager.GetCache().GetInformer(context.Background(), &kubevirtv1.KubeVirt{}, cache.BlockUntilSynced(false))
	if err != nil {
		t.Fatal(err)
	}
	if !inf.HasSynced() {
		t.Fatal("the KubeVirt CR informer was not started and synced with kvnet's manager")
	}
}
