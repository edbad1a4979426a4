package webhook_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/webhook"
)

// examplesDir holds the README's examples: the cluster state and policy the
// goldens are computed against.
const examplesDir = "../examples"

// exampleFacts reads the NADs, Namespaces and KubeVirt CR of examples/.
func exampleFacts(t testing.TB) *lookup.Snapshot {
	t.Helper()
	docs, err := offline.ReadFiles([]string{
		filepath.Join(examplesDir, "nads.yaml"),
		filepath.Join(examplesDir, "namespaces.yaml"),
		filepath.Join(examplesDir, "kubevirt.yaml"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := offline.Facts(docs)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func exampleConfig(t testing.TB) *config.Config {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(examplesDir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := config.Parse(data, "kvnet-system")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func exampleHandlers(t testing.TB) webhook.Handlers {
	return webhook.NewHandlers(config.Static(exampleConfig(t)), exampleFacts(t), app.Chains(app.Capabilities{}))
}

// review builds the admission request the API server would send.
func review(kind chain.Kind, op admissionv1.Operation, namespace string, obj, old []byte) admission.Request {
	resource := "virtualmachines"
	switch kind {
	case chain.KindVMI:
		resource = "virtualmachineinstances"
	case chain.KindVMIM:
		resource = "virtualmachineinstancemigrations"
	}
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	_ = json.Unmarshal(obj, &meta)
	if namespace == "" {
		namespace = meta.Metadata.Namespace
	}
	r := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:       "test-uid",
		Kind:      metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: string(kind)},
		Resource:  metav1.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: resource},
		Name:      meta.Metadata.Name,
		Namespace: namespace,
		Operation: op,
		Object:    runtime.RawExtension{Raw: obj},
	}}
	if old != nil {
		r.OldObject = runtime.RawExtension{Raw: old}
	}
	return r
}

// applyResponse applies a response's patch to raw, failing the test on a
// patch that does not apply (the API server would refuse it too).
func applyResponse(t testing.TB, raw []byte, resp admission.Response) []byte {
	t.Helper()
	if len(resp.Patches) == 0 {
		return raw
	}
	pb, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(pb)
	if err != nil {
		t.Fatalf("decoding patch %s: %v", pb, err)
	}
	out, err := p.Apply(raw)
	if err != nil {
		t.Fatalf("applying patch %s: %v", pb, err)
	}
	return out
}

func mutate(t testing.TB, hs webhook.Handlers, kind chain.Kind, op admissionv1.Operation, obj, old []byte) (admission.Response, []byte) {
	t.Helper()
	path := webhook.PathMutateVM
	if kind == chain.KindVMI {
		path = webhook.PathMutateVMI
	}
	resp := hs[path].Handle(context.Background(), review(kind, op, "", obj, old))
	if !resp.Allowed {
		return resp, nil
	}
	return resp, applyResponse(t, obj, resp)
}

func code(resp admission.Response) int32 {
	if resp.Result == nil {
		return 0
	}
	return resp.Result.Code
}
