package chart

import (
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/proxy/caexchange"
)

// The chart's RBAC for the KubeVirt CA exchange, on an API server that
// enforces it, as the proxy's ServiceAccount: the proxy's informer on
// kubevirt-ca (list and watch by name) syncs, a peer's bundle is stored in
// kubevirt-external-ca, and nothing else in KubeVirt's namespace is
// reachable: no other ConfigMap, no list without the name, no create.
func TestChartRBACOfTheKubeVirtCAExchange(t *testing.T) {
	migration := `
config:
  migration:
    inCluster: {nad: kubevirt/migration, pool: {cidr: 10.10.0.0/24}}
    crossCluster: {nad: kubevirt/crosscluster, addresses: [10.20.0.1/24]}
`
	for name, tc := range map[string]struct {
		c          chartCase
		kvNS, user string
		args       string // the Deployment's, or kvnet's config with the sidecar
	}{
		"separate Deployment": {
			c: chartCase{release: "casync", namespace: "casync-system", values: `
migrationProxy:
  enabled: true
  sidecar: {enabled: false}
  allowedSources: [10.200.0.0/24]
  certSecret: proxy-cert
  peers: [{name: cluster-b, addresses: ["192.0.2.1:9444"], caBundle: "unused here"}]
  kubevirtCA: {namespace: kv-casync}
`},
			kvNS: "kv-casync", user: "system:serviceaccount:casync-system:casync-kvnet-migration-proxy",
		},
		"sidecar of the synchronization controllers": {
			c: chartCase{release: "casync2", namespace: "casync2-system", values: migration + `
migrationProxy:
  enabled: true
  sidecar: {namespace: kv-casync2}
  certSecret: proxy-cert
  peers: [{name: cluster-b, addresses: ["192.0.2.1:9444"], caBundle: "unused here"}]
`},
			kvNS: "kv-casync2", user: "system:serviceaccount:kv-casync2:kubevirt-synchronization-controller",
		},
	} {
		t.Run(name, func(t *testing.T) { chartRBACOfTheKubeVirtCAExchange(t, tc.c, tc.kvNS, tc.user) })
	}
}

func chartRBACOfTheKubeVirtCAExchange(t *testing.T, c chartCase, kvNS, user string) {
	ctx := context.Background()
	if err := cl.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvNS}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kvNS}}) })
	objs := render(t, c)
	install(t, c, objs)

	// The proxy gets the flags that point it at KubeVirt's namespace, in
	// its Deployment or in the sidecar container of kvnet's config.
	var rendered string
	for _, o := range objs {
		if o.GetKind() == "Deployment" && strings.HasSuffix(o.GetName(), "-migration-proxy") || o.GetKind() == "ConfigMap" && o.GetLabels()["app.kubernetes.io/component"] != "migration-proxy" {
			rendered += toYAML(o.Object)
		}
	}
	for _, want := range []string{"--kubevirt-ca-sync=true", "--kubevirt-namespace=" + kvNS, "--kubevirt-ca-sync-interval=30s"} {
		if !strings.Contains(rendered, want) {
			t.Errorf("the proxy's args lack %s", want)
		}
	}

	ca, err := certs.NewCA("kubevirt.io", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{caexchange.KubeVirtCAName, caexchange.ExternalCAName, "kubevirt-config"} {
		if err := cl.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kvNS, Name: name},
			Data: map[string]string{caexchange.CABundleKey: string(ca.CertPEM)}}); err != nil {
			t.Fatal(err)
		}
	}
	saNS := strings.Split(user, ":")[2]
	kc := impersonatingKubeconfig(t, user, "system:serviceaccounts", "system:serviceaccounts:"+saNS, "system:authenticated")
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	local, err := cache.New(cfg, cache.Options{
		Scheme: app.Scheme(), DefaultNamespaces: map[string]cache.Config{kvNS: {}},
		ByObject: map[client.Object]cache.ByObject{&corev1.ConfigMap{}: {Field: fields.OneTermEqualSelector("metadata.name", caexchange.KubeVirtCAName)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.GetInformer(ctx, &corev1.ConfigMap{}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = local.Start(cctx) }()
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !local.WaitForCacheSync(sctx) {
		t.Fatal("the proxy's informer on kubevirt-ca did not sync as the chart's ServiceAccount")
	}

	s := &caexchange.Sync{Namespace: kvNS, Peers: []caexchange.Peer{{Name: "cluster-b"}}, LocalCA: local, APIReader: sa, Client: sa}
	if offer, err := s.LocalOffer(ctx); err != nil || len(offer) != 1 {
		t.Fatalf("reading kubevirt-ca as the proxy: %d certificates, %v", len(offer), err)
	}
	peerCA, err := certs.NewCA("kubevirt.io", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReceiveCAs(ctx, "cluster-b", []*x509.Certificate{peerCA.Cert}); err != nil {
		t.Fatalf("storing a peer's CA as the proxy: %v", err)
	}

	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as the proxy: got %v, want Forbidden", what, err)
		}
	}
	var cm corev1.ConfigMap
	forbidden("reading kubevirt-config", sa.Get(ctx, client.ObjectKey{Namespace: kvNS, Name: "kubevirt-config"}, &cm))
	forbidden("listing every ConfigMap", sa.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(kvNS)))
	forbidden("creating a ConfigMap", sa.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: kvNS, Name: "x"}}))
	if err := sa.Get(ctx, client.ObjectKey{Namespace: kvNS, Name: caexchange.KubeVirtCAName}, &cm); err != nil {
		t.Fatal(err)
	}
	cm.Data[caexchange.CABundleKey] = "overwritten"
	forbidden("updating kubevirt-ca", sa.Update(ctx, &cm))
}
