package webhook

import (
	"bytes"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// FuzzMarshalAgrees: the answer encoder writes exactly the bytes
// encoding/json does for every kind of value a kvnet patch carries, and for
// the answer itself,
// whatever the strings in them (HTML characters, control characters,
// invalid UTF-8).
func FuzzMarshalAgrees(f *testing.F) {
	for _, s := range []string{
		``, `x`, `<a href="x">&amp;</a>`, "\u2028\u2029\x00\x1f\x7f", "\xff\xfe", `{"name":"a"}`,
		`[{"name":"default","pod":{}},{"name":"storage","multus":{"networkName":"storage","default":true}}]`,
		`[{"name":"default","bridge":{}},{"name":"dp","binding":{"name":"vdpa"},"macAddress":"02:00:00:00:00:01","bootOrder":1,"ports":[{"port":80}],"pciAddress":"0000:81:00.1","acpiIndex":3}]`,
		`{"guest":"1Gi","reservedOverhead":{"memLock":"Required","addedOverhead":"512Mi"}}`,
		`{"k8s.v1.cni.cncf.io/networks":"[{\"name\":\"x\"}]","a":"<b>"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		values := []any{string(raw), true}
		var nets []kubevirtv1.Network
		if json.Unmarshal(raw, &nets) == nil {
			values = append(values, nets)
		}
		var ifaces []kubevirtv1.Interface
		if json.Unmarshal(raw, &ifaces) == nil {
			values = append(values, ifaces)
		}
		var mem kubevirtv1.Memory
		if json.Unmarshal(raw, &mem) == nil {
			values = append(values, &mem)
		}
		var m map[string]string
		if json.Unmarshal(raw, &m) == nil {
			values = append(values, m)
		}
		pt := admissionv1.PatchTypeJSONPatch
		s := string(raw)
		values = append(values, admissionv1.AdmissionReview{Response: &admissionv1.AdmissionResponse{
			UID: types.UID(s), Allowed: len(raw)%2 == 0, Patch: raw, PatchType: &pt, Warnings: []string{s},
			AuditAnnotations: map[string]string{s: s},
			Result: &metav1.Status{Message: s, Reason: metav1.StatusReason(s), Code: int32(len(raw)), Details: &metav1.StatusDetails{
				Causes: []metav1.StatusCause{{Type: metav1.CauseTypeFieldValueInvalid, Message: s, Field: s}},
			}},
		}})
		for _, v := range values {
			ops := []patchOp{{Op: "add", Path: "/metadata/annotations/" + string(raw), Value: v}}
			want, werr := json.Marshal(ops)
			got, err := marshal(ops)
			if (err == nil) != (werr == nil) || !bytes.Equal(got, want) {
				t.Fatalf("%T: encoding/json %s (%v), marshal %s (%v)", v, want, werr, got, err)
			}
		}
	})
}
