package chart

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/test/framework"
)

// The attack of issue 27, item 7: kvnet trusts any ConfigMap of its
// namespace labelled kvnet.io/migration-pool as an allocation. With the
// chart's ValidatingAdmissionPolicy on the real API server, only kvnet's
// own ServiceAccount may create, change or delete such a ConfigMap: even a
// cluster admin's writes are refused, while other ConfigMaps stay
// writable. (The synchronization controller's ServiceAccount, which holds
// the proxy's RBAC in sidecar mode, may create no ConfigMap there at all:
// TestChartSyncControllerCreatesNothingInKvnetNamespace.)
func TestChartPoolsPolicyAdmitsOnlyKvnet(t *testing.T) {
	ctx := context.Background()
	// KubeVirt's namespace of its own: other tests install sidecarValues'
	// and delete theirs, which takes a while to terminate.
	c := chartCase{release: "pools", namespace: "pools-system", values: strings.ReplaceAll(sidecarValues, "kv-sidecar", "pools-kv")}
	objs := render(t, c)
	install(t, c, objs)
	as := func(user string, groups ...string) client.Client {
		cfg := rest.CopyConfig(testEnv.Config)
		cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
		k, err := client.New(cfg, client.Options{Scheme: cl.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	sa := func(ns, name string) client.Client {
		return as("system:serviceaccount:"+ns+":"+name, "system:serviceaccounts", "system:serviceaccounts:"+ns)
	}
	kvnet := sa(c.namespace, "pools-kvnet")
	sync := sa("pools-kv", "kubevirt-synchronization-controller")

	forged := func(name string) *corev1.ConfigMap {
		return &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: name, Labels: map[string]string{migration.LabelPool: migration.PoolInCluster}},
			Data:       map[string]string{"address": "10.10.0.9", "prefixLength": "24", "state": "idle", "node": "node-1"},
		}
	}
	refusedByPolicy := func(err error) bool {
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only kvnet's ServiceAccount may write migration address allocations")
	}
	// The policy takes effect once the API server has loaded it.
	framework.Eventually(t, "the policy in force", time.Minute, func() error {
		if err := cl.Create(ctx, forged("probe"), client.DryRunAll); !refusedByPolicy(err) {
			return errNotYet{err}
		}
		return nil
	})

	if err := cl.Create(ctx, forged("kvnet-mig-ic-10-10-0-9")); !refusedByPolicy(err) {
		t.Errorf("a cluster admin's forged allocation: got %v, want the policy's refusal", err)
	}
	// ConfigMaps that are not allocations pass the policy.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: "pools-unlabelled"}}
	if err := cl.Create(ctx, other); err != nil {
		t.Errorf("an unlabelled ConfigMap as a cluster admin: %v", err)
	}
	// The proxy's own ConfigMaps (the chart's) are not allocations: the
	// synchronization controller's ServiceAccount writes them.
	mappings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: "kvnet-migration-proxy-mappings"}}
	if err := sync.Patch(ctx, mappings, client.RawPatch(types.MergePatchType, []byte(`{"data":{"tenant.vm1":"m"}}`))); err != nil {
		t.Errorf("the proxy's mappings ConfigMap as the synchronization controller: %v", err)
	}

	// kvnet itself writes, changes and deletes them.
	own := forged("kvnet-mig-ic-10-10-0-10")
	if err := kvnet.Create(ctx, own); err != nil {
		t.Fatalf("kvnet's own allocation: %v", err)
	}
	stolen := own.DeepCopy()
	stolen.Data["node"] = "node-2"
	if err := cl.Update(ctx, stolen); !refusedByPolicy(err) {
		t.Errorf("a cluster admin's change of kvnet's allocation: got %v, want the policy's refusal", err)
	}
	unlabelled := own.DeepCopy()
	unlabelled.Labels = nil
	if err := cl.Update(ctx, unlabelled); !refusedByPolicy(err) {
		t.Errorf("removing the pool label (the old object is an allocation): got %v, want the policy's refusal", err)
	}
	if err := cl.Delete(ctx, own); !refusedByPolicy(err) {
		t.Errorf("a cluster admin's delete of kvnet's allocation (frees an address in use): got %v, want the policy's refusal", err)
	}
	own.Data["state"] = "bound"
	if err := kvnet.Update(ctx, own); err != nil {
		t.Errorf("kvnet's change of its allocation: %v", err)
	}
	if err := kvnet.Delete(ctx, own); err != nil {
		t.Errorf("kvnet's delete of its allocation: %v", err)
	}
}

type errNotYet struct{ err error }

func (e errNotYet) Error() string {
	if e.err == nil {
		return "the forged allocation was admitted"
	}
	return e.err.Error()
}
