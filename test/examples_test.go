package test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/test/framework"
)

// The offline CLI and the webhook give the same result on examples/: every
// example VM is admitted offline and created through the real API server,
// and the stored spec and annotations must equal the offline output; the
// invalid examples must be refused by both, with the same message.
func TestExamplesOfflineEqualsWebhook(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(framework.RepoRoot(), "examples")
	cfgYAML, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	restore, err := env.SetConfig(string(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	defer restore()

	state, err := offline.ReadFiles([]string{
		filepath.Join(dir, "namespaces.yaml"), filepath.Join(dir, "nads.yaml"), filepath.Join(dir, "kubevirt.yaml"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range state {
		var u unstructured.Unstructured
		if err := json.Unmarshal(d.Raw, &u.Object); err != nil {
			t.Fatal(err)
		}
		switch d.Kind {
		case "KubeVirt":
			var kv kubevirtv1.KubeVirt
			if err := json.Unmarshal(d.Raw, &kv); err != nil {
				t.Fatal(err)
			}
			setKubeVirt(t, kv.Spec)
			continue
		case "Namespace":
			if err := env.Client.Create(ctx, &u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), &u) })
			env.WaitCached(t, &corev1.Namespace{}, client.ObjectKey{Name: u.GetName()})
			continue
		}
		if err := env.Client.Create(ctx, &u); err != nil {
			t.Fatalf("%s: %v", d.Source, err)
		}
		waitCachedUnstructured(t, &u)
	}

	facts, err := offline.Facts(state)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(cfgYAML, framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	admitter := app.NewOfflineAdmitter(cfg, facts)
	vms, err := offline.ReadFiles([]string{filepath.Join(dir, "vms.yaml"), filepath.Join(dir, "invalid.yaml")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(vms) < 5 {
		t.Fatalf("examples hold %d VMs; the test expects the valid and invalid sets", len(vms))
	}
	for _, d := range vms {
		res, ok, err := admitter.Admit(ctx, d)
		if err != nil || !ok {
			t.Fatalf("%s: offline admission: ok=%v err=%v", d.Source, ok, err)
		}
		var u unstructured.Unstructured
		if err := json.Unmarshal(d.Raw, &u.Object); err != nil {
			t.Fatal(err)
		}
		createErr := env.Client.Create(ctx, &u)
		if res.Denied != "" {
			if createErr == nil {
				t.Errorf("%s: offline refused (%s) but the webhook accepted", d.Source, res.Denied)
				continue
			}
			first := strings.SplitN(res.Denied, "\n", 2)[0]
			if !strings.Contains(createErr.Error(), first) {
				t.Errorf("%s: refusals differ:\n offline: %s\n webhook: %v", d.Source, first, createErr)
			}
			continue
		}
		if createErr != nil {
			t.Errorf("%s: offline accepted but the webhook refused: %v", d.Source, createErr)
			continue
		}
		var stored unstructured.Unstructured
		stored.SetGroupVersionKind(u.GroupVersionKind())
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&u), &stored); err != nil {
			t.Fatal(err)
		}
		var want map[string]any
		if err := json.Unmarshal(res.Mutated, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalize(t, stored.Object["spec"]), want["spec"]) {
			a, _ := json.MarshalIndent(stored.Object["spec"], "", " ")
			b, _ := json.MarshalIndent(want["spec"], "", " ")
			t.Errorf("%s: spec differs\nwebhook: %s\noffline: %s", d.Source, a, b)
		}
		wantAnn, _, _ := unstructured.NestedStringMap(want, "metadata", "annotations")
		if got := stored.GetAnnotations(); !reflect.DeepEqual(got, wantAnn) {
			t.Errorf("%s: annotations differ\nwebhook: %v\noffline: %v", d.Source, got, wantAnn)
		}
	}
}

// waitCachedUnstructured waits until kvnet's cache has a NAD created as unstructured.
func waitCachedUnstructured(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	if u.GetKind() != "NetworkAttachmentDefinition" {
		return
	}
	var probe unstructured.Unstructured
	probe.SetGroupVersionKind(u.GroupVersionKind())
	env.WaitCached(t, &probe, client.ObjectKeyFromObject(u))
}

// normalize round-trips v through JSON so integers compare equal to the
// float64s encoding/json produces.
func normalize(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
