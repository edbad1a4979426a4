package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	jsonpatch "gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Every answer kvnet gives, and the rare shapes it can, encodes to exactly
// the bytes encoding/json writes for the same AdmissionReview.
func TestAppendReviewIsEncodingJSONs(t *testing.T) {
	pt := admissionv1.PatchTypeJSONPatch
	patched := admission.Allowed("")
	patched.Patch, patched.PatchType = []byte(`[{"op":"add","path":"/a","value":"<b>&"}]`), &pt
	withDetails := admission.Denied("no")
	withDetails.Result.Details = &metav1.StatusDetails{Name: "vm1", Causes: []metav1.StatusCause{{Field: "spec", Message: "bad"}}}
	withKind := admission.Allowed("")
	withKind.Result.Kind = "Status"
	audit := admission.Allowed("ok")
	audit.AuditAnnotations = map[string]string{"b": "2", "a": "1 <&>"}
	audit.Warnings = []string{"first", "second \u2028"}
	cases := map[string]admission.Response{
		"allowed":            admission.Allowed(""),
		"allowed with a why": admission.Allowed("namespace is excluded by config"),
		"patched":            patched,
		"denied":             admission.Denied(`metadata.annotations[kvnet.io/networks]: "<x>" is not a network & never was`),
		"errored":            admission.Errored(http.StatusInternalServerError, errors.New("kvnet failed, not the object")),
		"invalid utf-8":      admission.Denied("bad \xff byte"),
		"details":            withDetails,
		"status kind":        withKind,
		"audit and warnings": audit,
		"no status":          {AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true}},
		"only warnings":      {AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true, Warnings: []string{"w"}}},
	}
	for name, resp := range cases {
		for _, version := range []string{"admission.k8s.io/v1", "admission.k8s.io/v1beta1"} {
			resp.UID = types.UID("705ab4f5-6393-11e8-b7cc-42010a800002")
			want, err := json.Marshal(admissionv1.AdmissionReview{
				TypeMeta: metav1.TypeMeta{APIVersion: version, Kind: "AdmissionReview"},
				Response: &resp.AdmissionResponse,
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := appendReview(nil, version, &resp.AdmissionResponse)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s (%s):\n got %s\nwant %s", name, version, got, want)
			}
		}
	}
}

func TestAppendReviewStatusWithListMeta(t *testing.T) {
	resp := admission.Denied("no")
	resp.Result.ResourceVersion = "42"
	want, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "v", Kind: "AdmissionReview"}, Response: &resp.AdmissionResponse})
	got, err := appendReview(nil, "v", &resp.AdmissionResponse)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("got %s (%v), want %s", got, err, want)
	}
}

// The patch is encoded by segmentio/encoding; it must be byte for byte
// what encoding/json writes for the same operations, whatever the values:
// KubeVirt's lists, maps (sorted keys), quantities (their MarshalJSON),
// strings HTML and JavaScript escape or repair, a remove's absent value.
func TestPatchEncodingIsEncodingJSONs(t *testing.T) {
	bootOrder := uint(2)
	ops := []jsonpatch.Operation{
		{Operation: "add", Path: "/metadata/annotations/kvnet.io~1mutations", Value: `[{"mutator":"kube-ovn"}] <= v1.12 & "more" ` + "\u2028 bad \xff"},
		{Operation: "add", Path: "/spec/template/metadata/annotations", Value: map[string]string{"z": "1", "a": "<2>", "m": ""}},
		{Operation: "add", Path: "/spec/template/spec/networks", Value: []kubevirtv1.Network{
			{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
			{Name: "ovn", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "tenant-a/ovn", Default: true}}},
		}},
		{Operation: "add", Path: "/spec/template/spec/domain/devices/interfaces/-", Value: kubevirtv1.Interface{
			Name: "dp", Binding: &kubevirtv1.PluginBinding{Name: "vdpa"}, MacAddress: "02:00:00:00:00:01", BootOrder: &bootOrder,
			Ports: []kubevirtv1.Port{{Name: "http", Port: 80}}, ACPIIndex: 3,
		}},
		{Operation: "replace", Path: "/spec/template/spec/domain/devices/networkInterfaceMultiqueue", Value: false},
		{Operation: "add", Path: "/spec/template/spec/domain/memory", Value: &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("8Gi")),
			ReservedOverhead: &kubevirtv1.ReservedOverhead{MemLock: ptr.To(kubevirtv1.MemLockRequirement(kubevirtv1.MemLockRequired))}}},
		{Operation: "remove", Path: "/spec/template/spec/domain/devices/interfaces/1"},
	}
	resp := admission.Patched("", ops...)
	var buffers answerBuffers
	defer buffers.release()
	if err := encodePatch(&resp, &buffers); err != nil {
		t.Fatal(err)
	}
	if want := encodingJSONs(t, ops); !bytes.Equal(resp.Patch, want) {
		t.Fatalf("patch:\n got %s\nwant %s", resp.Patch, want)
	}
}
