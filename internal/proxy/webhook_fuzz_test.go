package proxy

import (
	"context"
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/apijson/apijsontest"
	"github.com/kvnet/kvnet/internal/proxy/store"
)

// statusSeeds are VMI bodies for the status rewrite's fuzz targets.
var statusSeeds = []string{
	``, `{`, `null`, `[]`, `{}`, `{"status":null}`, `{"status":{"migrationState":null}}`,
	`{"metadata":{"name":"web"},"status":{"migrationState":{"targetState":{}}}}`,
	`{"metadata":{"name":"web","annotations":{"kvnet.io/migration-proxy":"x"}},"status":{"migrationState":{"migrationUid":"uid-1","targetNodeAddress":"10.0.0.9","targetDirectMigrationNodePorts":{"40001":0,"40002":49152},"targetState":{"nodeAddress":"10.0.0.9","directMigrationNodePorts":{"40001":0,"40002":49152}}}}}`,
	`{"metadata":{"name":"web"},"status":{"migrationState":{"targetNodeAddress":"10.0.0.9","targetDirectMigrationNodePorts":{},"targetState":{"nodeAddress":"10.0.0.9","directMigrationNodePorts":{"1":2}}}}}`,
	`{"metadata":{"name":"web"},"status":{"migrationState":{"targetNodeAddress":7,"targetDirectMigrationNodePorts":"x","targetState":{"nodeAddress":""}}}}`,
	`{"metadata":{"name":"web"},"Status":{"migrationState":{"targetNodeAddress":"10.0.0.9","targetState":{}}}}`,
}

// FuzzStatusViewDecodersAgree holds apijson's fast path to the API
// server's decoder on the rewrite's view, whose raw members must keep a
// present null apart from a missing key.
func FuzzStatusViewDecodersAgree(f *testing.F) {
	for _, s := range statusSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"status":{"migrationState":{"targetNodeAddress":null,"targetDirectMigrationNodePorts":null}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if _, err := apijsontest.Agree(raw, func() any { return new(statusView) }); err != nil {
			t.Fatal(err)
		}
	})
}

// The rewrite's view decodes on apijson's fast path, as the benchmarks
// assume.
func TestStatusViewTakesTheFastPath(t *testing.T) {
	if !apijson.Fast([]byte(statusSeeds[8]), new(statusView)) {
		t.Fatal("statusView is off apijson's fast path")
	}
	if fast, err := apijsontest.Agree([]byte(statusSeeds[8]), func() any { return new(statusView) }); err != nil || !fast {
		t.Fatalf("fast=%v err=%v", fast, err)
	}
}

// FuzzStatusRewriter feeds arbitrary VMI bytes, as UPDATEs, to the
// migration-status rewrite with a source migration of VMI "web" in flight
// and a published mapping for it (a fake client: the lookups' API semantics
// are the integration tests' business, this is about decoding). It never
// answers 500, its patch applies, and the patched VMI sent again yields no
// patch: virt-handler's next status write must not flap the fields.
func FuzzStatusRewriter(f *testing.F) {
	mapping := store.Mapping{MigrationID: "m1", Address: "192.168.7.2", Target: "10.0.0.9", Ports: map[string]string{"40001": "31001", "40002": "31002"}}.Encode()
	for _, s := range statusSeeds {
		f.Add([]byte(s))
	}
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		f.Fatal(err)
	}
	if err := kubevirtv1.AddToScheme(s); err != nil {
		f.Fatal(err)
	}
	vmim := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "mig", UID: "uid-1"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "web", SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: "m1"}},
	}
	ms := store.MappingStore{Namespace: "kvnet-system"}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kvnet-system", Name: store.DefaultMappingsName},
		Data:       map[string]string{"tenant-a.web": mapping},
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(vmim, cm).Build()
	h := &StatusRewriter{Reader: c, APIReader: c, Store: ms, MappingsReader: c}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, raw []byte) {
		resp := h.Handle(ctx, statusReview(raw))
		if resp.Result != nil && resp.Result.Code >= 500 {
			t.Fatalf("%d %s", resp.Result.Code, resp.Result.Message)
		}
		if !resp.Allowed || len(resp.Patches) == 0 {
			return
		}
		pb, _ := json.Marshal(resp.Patches)
		p, err := jsonpatch.DecodePatch(pb)
		if err != nil {
			t.Fatalf("decoding patch %s: %v", pb, err)
		}
		y, err := p.Apply(raw)
		if err != nil {
			t.Fatalf("applying patch %s to %s: %v", pb, raw, err)
		}
		if again := h.Handle(ctx, statusReview(y)); !again.Allowed || len(again.Patches) > 0 {
			t.Fatalf("second run on its own output: allowed=%v %v, patch %v\nfirst patch %s\noutput %s", again.Allowed, again.Result, again.Patches, pb, y)
		}
	})
}

func statusReview(raw []byte) admission.Request {
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "vmi-uid", Kind: metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachineInstance"},
		Resource: metav1.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"},
		Name:     "web", Namespace: "tenant-a", Operation: admissionv1.Update,
		Object: runtime.RawExtension{Raw: raw}, OldObject: runtime.RawExtension{Raw: raw},
	}}
}
