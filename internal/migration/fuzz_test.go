package migration

import (
	"context"
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/webhook"
)

// FuzzMigrationPods feeds arbitrary pod bytes to the migration-pods webhook
// as the server builds it, with both migration networks configured and a
// fresh allocation store (a fake client: the allocator's API semantics are
// the integration tests' business, this is about decoding) per input. The
// webhook never answers 500, a patch applies (the proxy sidecar's
// container and volumes too), and the patched pod sent
// again (a reinvoked webhook) keeps its reservation: no second patch.
func FuzzMigrationPods(f *testing.F) {
	for _, s := range []string{
		``, `{`, `null`, `[]`, `{}`, `{"metadata":null}`, `{"metadata":{"labels":null,"annotations":null}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-handler"}}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-handler"},"annotations":{"k8s.v1.cni.cncf.io/networks":"migration@migration0"}},"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]}]}}}}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-synchronization-controller"},"annotations":{"k8s.v1.cni.cncf.io/networks":"[{\"name\":\"cross\",\"namespace\":\"kubevirt\",\"x.io/k\":[1]}]"}}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-handler","kvnet.io/migration-reservation":"token-9"},"annotations":{"k8s.v1.cni.cncf.io/networks":"[{\"name\":\"migration\",\"interface\":\"migration0\",\"ips\":[\"10.0.0.1/29\"]}]"}}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-handler"},"annotations":{"k8s.v1.cni.cncf.io/networks":"a/b/c"}}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-synchronization-controller"}},"spec":{"containers":[{"name":"sync","volumeMounts":[{"name":"t","mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}]}],"volumes":[{"name":"t"}]}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-synchronization-controller"}},"spec":{"containers":[{"name":"sync"},{"name":"kvnet-proxy"}]}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-synchronization-controller"}},"spec":{"containers":null,"volumes":[{"name":"kvnet-proxy-cert"}]}}`,
		`{"metadata":{"labels":{"kubevirt.io":"virt-synchronization-controller"}},"spec":{}}`,
	} {
		f.Add([]byte(s))
	}
	cfg := config.Static(mustConfig(f, bothNetworks+sidecarSection))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, raw []byte) {
		h := webhook.NewHandlers(cfg, facts(), webhook.Chains{
			MigrationPod: []chain.PodMutator{newMutator(newFake(t)), Sidecar{}},
		})[webhook.PathMutateMigrationPods]
		resp := h.Handle(ctx, migrationPodReview(raw))
		if resp.Result != nil && resp.Result.Code >= 500 {
			t.Fatalf("%d %s", resp.Result.Code, resp.Result.Message)
		}
		if !resp.Allowed || len(resp.Patches) == 0 {
			return
		}
		y := applyPatch(t, raw, resp)
		again := h.Handle(ctx, migrationPodReview(y))
		if !again.Allowed || len(again.Patches) > 0 {
			t.Fatalf("second run on its own output: allowed=%v %v, patch %v\nfirst patch %v\noutput %s", again.Allowed, again.Result, again.Patches, resp.Patches, y)
		}
	})
}

func migrationPodReview(raw []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "pod-uid", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		Namespace: "kubevirt", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
	}}
}

// applyPatch applies a response's patch as the API server would; one that
// does not apply fails the test.
func applyPatch(t *testing.T, raw []byte, resp admission.Response) []byte {
	t.Helper()
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
		t.Fatalf("applying patch %s to %s: %v", pb, raw, err)
	}
	return out
}
