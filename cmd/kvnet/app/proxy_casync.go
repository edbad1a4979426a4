package app

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/caexchange"
)

// configMapCache is an informer on one ConfigMap (not on every ConfigMap
// of the cluster): the proxy's RBAC lists and watches it by name only.
// The caller starts it (mgr.Add, or a runnable of its own).
func configMapCache(mgr manager.Manager, namespace, name string) (cache.Cache, cache.Informer, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:            mgr.GetScheme(),
		DefaultNamespaces: map[string]cache.Config{namespace: {}},
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Field: fields.OneTermEqualSelector("metadata.name", name)},
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating the cache of ConfigMap %s/%s: %w", namespace, name, err)
	}
	inf, err := c.GetInformer(context.Background(), &corev1.ConfigMap{})
	if err != nil {
		return nil, nil, fmt.Errorf("starting the informer of ConfigMap %s/%s: %w", namespace, name, err)
	}
	return c, inf, nil
}

// setupCASync keeps the KubeVirt CAs of this cluster and its peers in step
// over the hop (docs/migration-proxy.md, "KubeVirt CA exchange"): it
// offers kubevirt-ca on each change and every interval, and makes ts store
// what peers offer. It runs on the leader only, like the hop listener.
func setupCASync(mgr manager.Manager, o ProxyOptions, dialer *proxy.Dialer, ts *proxy.TargetServer) error {
	ns := o.KubeVirtNamespace
	if ns == "" {
		ns = caexchange.DefaultKubeVirtNamespace
	}
	local, inf, err := configMapCache(mgr, ns, caexchange.KubeVirtCAName)
	if err != nil {
		return err
	}
	s := &caexchange.Sync{
		Namespace: ns, Peers: proxy.CAPeers(o.Peers, dialer), Interval: o.CASyncInterval,
		LocalCA: local, APIReader: mgr.GetAPIReader(), Client: mgr.GetClient(),
		Log: mgr.GetLogger().WithName("migration-proxy").WithName("kubevirt-ca"),
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.Trigger() },
		UpdateFunc: func(any, any) { s.Trigger() },
		DeleteFunc: func(any) { s.Trigger() },
	}); err != nil {
		return fmt.Errorf("watching %s/%s: %w", ns, caexchange.KubeVirtCAName, err)
	}
	ts.CAs = s
	// The cache starts with the exchange, on the leader, and not in the
	// manager's cache group: the manager waits for those to sync before it
	// starts anything, so a Role missing in KubeVirt's namespace would stop
	// the whole proxy rather than only the exchange.
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		go func() {
			if err := local.Start(ctx); err != nil {
				s.Log.Error(err, "the kubevirt-ca informer stopped")
			}
		}()
		for {
			wctx, cancel := context.WithTimeout(ctx, caCacheSyncWarning)
			synced := local.WaitForCacheSync(wctx)
			cancel()
			if synced {
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			s.Log.Error(nil, "cannot read kubevirt-ca yet; is the proxy's Role in KubeVirt's namespace missing?", "namespace", ns, "waited", caCacheSyncWarning.String())
		}
		return s.Start(ctx)
	}))
}

// caCacheSyncWarning is how long the kubevirt-ca informer may take to sync
// before each log line that says so.
const caCacheSyncWarning = 30 * time.Second
