package chart

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/internal/proxy/store"
)

// The chart creates the Lease and the two ConfigMaps the proxy writes (so
// that the proxy needs no create in kvnet's namespace), and a real helm,
// against the real API server, never wipes what the proxy wrote in them:
// installing over ConfigMaps an earlier proxy created adopts them with
// --take-ownership, data and all (and refuses without it); upgrading to a
// new chart version patches their metadata but leaves the data and the
// lease holder (Helm's three-way merge touches only what the chart
// renders, and it renders neither); turning the proxy off and on again,
// and uninstalling, keep the ConfigMaps (helm.sh/resource-policy: keep).
func TestChartUpgradeKeepsWhatTheProxyWrote(t *testing.T) {
	ctx := t.Context()
	const release, ns, kv = "upg", "upg-system", "upg-kv"
	values := `
migrationProxy: {enabled: true, sidecar: {namespace: upg-kv}}
config:
  migration:
    inCluster: {nad: upg-kv/migration, pool: {cidr: 10.10.0.0/24}}
    crossCluster: {nad: upg-kv/crosscluster, addresses: [10.20.0.10/24]}
`
	for _, n := range []string{ns, kv} {
		nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
		if err := cl.Create(ctx, nsObj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cl.Delete(context.Background(), nsObj) })
	}
	kubeconfig := adminKubeconfig(t)
	run := func(chartDir, values string, args ...string) error {
		t.Helper()
		args = append(args, "--kubeconfig", kubeconfig, "--namespace", ns)
		if chartDir != "" {
			args = append(args, chartDir)
		}
		_, err := helm(t, values, args...) // its error holds helm's output
		return err
	}
	t.Cleanup(func() { _ = run("", "", "uninstall", release) })

	// What the proxy writes, as the synchronization controller's
	// ServiceAccount with the chart's RBAC: a mapping, a binding, and the
	// lease holder (leader election updates the whole spec).
	sync := impersonating(t, "system:serviceaccount:"+kv+":kubevirt-synchronization-controller",
		"system:serviceaccounts", "system:serviceaccounts:"+kv)
	mappingsKey := client.ObjectKey{Namespace: ns, Name: store.DefaultMappingsName}
	bindingsKey := client.ObjectKey{Namespace: ns, Name: store.DefaultBindingsName}
	leaseKey := client.ObjectKey{Namespace: ns, Name: "upg-kvnet-migration-proxy"}
	const binding = `{"migrationID":"m1","peer":"east","namespace":"tenant","vmim":"in","uid":"u1"}`
	wrote := map[client.ObjectKey]map[string]string{
		mappingsKey: {"tenant.vm1": "relays"},
		bindingsKey: {"m1": binding},
	}

	// An earlier proxy created the bindings itself: they carry no Helm
	// ownership, so helm refuses to install over them...
	if err := cl.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: bindingsKey.Name},
		Data: map[string]string{"m0": binding}}); err != nil {
		t.Fatal(err)
	}
	if err := run(chart, values, "install", release); err == nil || !strings.Contains(err.Error(), "invalid ownership metadata") {
		t.Fatalf("helm install over the proxy's own bindings ConfigMap: %v, want helm's ownership refusal", err)
	}
	// ...until told to take them over, which keeps their data.
	if err := run(chart, values, "install", release, "--take-ownership"); err != nil {
		t.Fatal(err)
	}
	expectData(t, bindingsKey, map[string]string{"m0": binding})

	for key, data := range wrote {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		patch := toJSON(t, map[string]any{"data": data})
		if err := sync.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatalf("the proxy's write of %s: %v", key, err)
		}
	}
	wrote[bindingsKey]["m0"] = binding
	var lease coordinationv1.Lease
	if err := sync.Get(ctx, leaseKey, &lease); err != nil {
		t.Fatalf("the chart's Lease as the proxy: %v", err)
	}
	lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: ptr.To("sync-1_uid"), LeaseDurationSeconds: ptr.To[int32](15),
		RenewTime: &metav1.MicroTime{Time: time.Now()}, LeaseTransitions: ptr.To[int32](1)}
	if err := sync.Update(ctx, &lease); err != nil {
		t.Fatalf("taking the chart's Lease as the proxy: %v", err)
	}

	// A new chart version: helm patches the objects' labels.
	next := filepath.Join(t.TempDir(), "kvnet")
	if err := os.CopyFS(next, os.DirFS(chart)); err != nil {
		t.Fatal(err)
	}
	chartYAML := filepath.Join(next, "Chart.yaml")
	meta, err := os.ReadFile(chartYAML)
	if err != nil {
		t.Fatal(err)
	}
	bumped := regexp.MustCompile(`(?m)^version: .*$`).ReplaceAllString(string(meta), "version: 99.0.0")
	if err := os.WriteFile(chartYAML, []byte(bumped), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := run(next, values, "upgrade", release); err != nil {
		t.Fatal(err)
	}
	for key, data := range wrote {
		cm := expectData(t, key, data)
		if v := cm.Labels["helm.sh/chart"]; v != "kvnet-99.0.0" {
			t.Errorf("%s after the upgrade carries helm.sh/chart=%s: helm did not patch it", key, v)
		}
	}
	var after coordinationv1.Lease
	if err := cl.Get(ctx, leaseKey, &after); err != nil {
		t.Fatal(err)
	}
	if after.Spec.HolderIdentity == nil || *after.Spec.HolderIdentity != "sync-1_uid" || after.Labels["helm.sh/chart"] != "kvnet-99.0.0" {
		t.Errorf("the Lease after the upgrade: holder %v, labels %v; want the proxy's holder kept and the new chart's labels", after.Spec.HolderIdentity, after.Labels)
	}

	// The proxy turned off: its RBAC and Lease go, the ConfigMaps stay;
	// turned on again, the release adopts them again.
	if err := run(next, "migrationProxy: {enabled: false}\n", "upgrade", release); err != nil {
		t.Fatal(err)
	}
	if err := cl.Get(ctx, leaseKey, &coordinationv1.Lease{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Lease with the proxy off: %v, want it deleted", err)
	}
	for key, data := range wrote {
		expectData(t, key, data)
	}
	if err := run(next, values, "upgrade", release); err != nil {
		t.Fatal(err)
	}
	if err := cl.Get(ctx, leaseKey, &coordinationv1.Lease{}); err != nil {
		t.Errorf("the Lease with the proxy on again: %v", err)
	}
	for key, data := range wrote {
		expectData(t, key, data)
	}

	if err := run("", "", "uninstall", release); err != nil {
		t.Fatal(err)
	}
	for key, data := range wrote {
		expectData(t, key, data)
	}
}

// expectData fails the test unless ConfigMap key holds exactly data.
func expectData(t *testing.T, key client.ObjectKey, data map[string]string) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	if err := cl.Get(context.Background(), key, &cm); err != nil {
		t.Fatalf("ConfigMap %s: %v", key, err)
	}
	if toJSON(t, cm.Data) != toJSON(t, data) {
		t.Errorf("ConfigMap %s holds %v, want %v", key, cm.Data, data)
	}
	return &cm
}

// toJSON is v as JSON (maps with sorted keys, so equal maps give equal
// strings).
func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// impersonating is a client of the test API server acting as user.
func impersonating(t *testing.T, user string, groups ...string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(testEnv.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	c, err := client.New(cfg, client.Options{Scheme: cl.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// adminKubeconfig is a cluster-admin kubeconfig file for helm.
func adminKubeconfig(t *testing.T) string {
	t.Helper()
	admin, err := testEnv.AddUser(envtest.User{Name: "chart-helm-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
