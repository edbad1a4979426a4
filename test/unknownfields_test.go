package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/test/framework"
)

// futureKnob is the field the "newer KubeVirt" has: added to a copy of the
// real v1.9.0 VMI CRD, on the interface items, the list kvnet rewrites when
// it adds a network. kvnet's vendored kubevirt.io/api does not know it.
const futureKnob = "futureKnob"

var crdGVK = schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}

// A cluster may run a newer KubeVirt than kvnet's vendored API. A field that
// newer schema knows and kvnet does not must survive kvnet's patch. The
// "newer" schema is KubeVirt v1.9.0's real VMI CRD (test/crds) with one field
// added, installed for this test only. A field neither schema knows is
// pruned by the API server, which shows the schema is really applied.
func TestFieldOfNewerKubeVirtSurvivesKvnet(t *testing.T) {
	ctx := context.Background()
	installNewerVMICRD(t)
	ns := env.NewNamespace(t, map[string]string{"kvnet.io/storage-network": "true"})
	env.CreateNAD(t, ns, "storage", "", `{"cniVersion":"0.4.0","name":"storage","type":"bridge"}`)
	var u unstructured.Unstructured
	if err := json.Unmarshal([]byte(`{
  "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
  "metadata": {"name": "future", "namespace": "`+ns+`"},
  "spec": {
    "domain": {
      "devices": {"interfaces": [{"name": "default", "masquerade": {}, "`+futureKnob+`": "kept", "notInAnySchema": "pruned"}]},
      "resources": {"requests": {"memory": "1Gi"}}
    },
    "networks": [{"name": "default", "pod": {}}]
  }
}`), &u.Object); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &u); err != nil {
		t.Fatal(err)
	}
	var got unstructured.Unstructured
	got.SetGroupVersionKind(u.GroupVersionKind())
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&u), &got); err != nil {
		t.Fatal(err)
	}
	ifaces, _, _ := unstructured.NestedSlice(got.Object, "spec", "domain", "devices", "interfaces")
	if len(ifaces) != 2 || ifaces[1].(map[string]any)["name"] != "storage" {
		t.Fatalf("interfaces = %v, want default + storage from the rule: kvnet did rewrite the list", ifaces)
	}
	first := ifaces[0].(map[string]any)
	if first[futureKnob] != "kept" {
		t.Errorf("interfaces[0] = %v: the newer schema's %s was lost in kvnet's patch", first, futureKnob)
	}
	if _, ok := first["notInAnySchema"]; ok {
		t.Errorf("interfaces[0] = %v: a field no schema knows was stored, so the schema is not applied", first)
	}
}

// installNewerVMICRD replaces the VMI CRD by the real one plus futureKnob,
// waits until the API server serves it, and restores the real one after the
// test.
func installNewerVMICRD(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join(framework.KubeVirtCRDDir(), "virtualmachineinstances.kubevirt.io.json"))
	if err != nil {
		t.Fatal(err)
	}
	var real map[string]any
	if err := json.Unmarshal(b, &real); err != nil {
		t.Fatal(err)
	}
	newer := runtime.DeepCopyJSON(real)
	versions, _, _ := unstructured.NestedSlice(newer, "spec", "versions")
	for i := range versions {
		v := versions[i].(map[string]any)
		path := []string{"schema", "openAPIV3Schema", "properties", "spec", "properties", "domain", "properties", "devices", "properties", "interfaces", "items", "properties"}
		props, found, err := unstructured.NestedMap(v, path...)
		if err != nil || !found {
			t.Fatalf("version %v: no interface item properties in the real CRD (%v)", v["name"], err)
		}
		props[futureKnob] = map[string]any{"type": "string", "description": "A field of a newer KubeVirt (test only)."}
		if err := unstructured.SetNestedMap(v, props, path...); err != nil {
			t.Fatal(err)
		}
	}
	if err := unstructured.SetNestedSlice(newer, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	setSpec := func(spec any) error {
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var crd unstructured.Unstructured
			crd.SetGroupVersionKind(crdGVK)
			if err := env.Client.Get(ctx, client.ObjectKey{Name: "virtualmachineinstances.kubevirt.io"}, &crd); err != nil {
				return err
			}
			crd.Object["spec"] = spec
			return env.Client.Update(ctx, &crd)
		})
	}
	if err := setSpec(newer["spec"]); err != nil {
		t.Fatalf("installing the newer VMI CRD: %v", err)
	}
	t.Cleanup(func() {
		if err := setSpec(real["spec"]); err != nil {
			t.Errorf("restoring KubeVirt's VMI CRD: %v", err)
		}
	})
	// The API server swaps its handler for the CRD asynchronously: wait until
	// a dry run keeps the new field.
	probe := map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "schema-probe", "namespace": "default", "annotations": map[string]any{"kvnet.io/skip": "true"}},
		"spec": map[string]any{"domain": map[string]any{"devices": map[string]any{
			"interfaces": []any{map[string]any{"name": "default", "masquerade": map[string]any{}, futureKnob: "x"}}}},
			"networks": []any{map[string]any{"name": "default", "pod": map[string]any{}}}},
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(probe)}
		if err := env.Client.Create(ctx, u, client.DryRunAll); err != nil {
			last = err.Error()
			return false, nil
		}
		ifaces, _, _ := unstructured.NestedSlice(u.Object, "spec", "domain", "devices", "interfaces")
		last = fmt.Sprint(ifaces)
		return len(ifaces) == 1 && ifaces[0].(map[string]any)[futureKnob] == "x", nil
	})
	if err != nil {
		t.Fatalf("the API server never served the newer VMI schema; last dry run: %s", last)
	}
}
