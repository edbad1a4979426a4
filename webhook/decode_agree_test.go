package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/apijson/apijsontest"
)

// agreeSeeds are the objects of the golden inputs and examples, the real
// API server's launcher-pod review, each object wrapped in a review, and
// the inputs v2 and v1 treat differently.
func agreeSeeds(t testing.TB) [][]byte {
	t.Helper()
	paths, _ := filepath.Glob("testdata/*.yaml")
	more, _ := filepath.Glob("../examples/*.yaml")
	var out [][]byte
	for _, p := range append(paths, more...) {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			if j, err := yaml.YAMLToJSON(doc); err == nil && len(j) > 2 && j[0] == '{' {
				out = append(out, j)
				out = append(out, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","object":`+string(j)+`,"oldObject":null}}`))
			}
		}
	}
	review, err := os.ReadFile("../test/loadtest/testdata/launcher-pod-review.json")
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, review)
	for _, s := range []string{
		`{}`, `null`, `{"metadata":null,"spec":null}`,
		`{"metadata":{"name":"a","name":"b"}}`,
		`{"metadata":{"annotations":{"a":"1","a":"2"}}}`,
		`{"spec":{"template":{"spec":{"networks":[{"name":"x","multus":{"networkName":"n"}}]}},"template":{}}}`,
		`{"metAdata":{"name":"a"},"Spec":{}}`,
		"{\"metadata\":{\"name\":\"\xff\"}}",
		`{"metadata":{"name":"a"}} trailing`,
		`{"spec":{"domain":{"memory":{"guest":"1Gi"},"devices":{"networkInterfaceMultiqueue":true,"interfaces":[{"name":"x","binding":{"name":"vdpa"}}]}}}}`,
		`{"spec":{"nodeName":"n1","affinity":{"nodeAffinity":{}}}}`,
		`{"metadata":{"creationTimestamp":"2026-01-01T00:00:00Z","deletionTimestamp":"2026-01-01T00:00:00Z","ownerReferences":[{"kind":"VirtualMachine","controller":true}]}}`,
		`{"request":{"object":null,"oldObject":{"a":1}}}`,
		`{"request":{"uid":"u","object":{"a":[1,2,{"b":null}]},"userInfo":{"username":"x","extra":{"k":["v"]}},"dryRun":true,"options":{"kind":"CreateOptions"}}}`,
		`{"request":{"object":1e400}}`,
	} {
		out = append(out, []byte(s))
	}
	return out
}

// withoutScanNotes is view without what the scan notes about how it read
// the object (vmiSpecView.whole), which no decoder of values has, and
// without the storage it holds for its parts and its chain request.
func withoutScanNotes(view any) any {
	var spec *vmiSpecView
	switch v := view.(type) {
	case *vmView:
		if v.Spec != nil && v.Spec.Template != nil {
			spec = v.Spec.Template.Spec
		}
	case *vmiView:
		spec = v.Spec
	}
	if spec != nil {
		spec.whole = wholeLists{}
	}
	// A view holds its parts and its chain request's (which its
	// pointers point into, so a copy still shows them); v1 fills neither.
	switch v := view.(type) {
	case *vmView:
		c := *v
		c.scanned, c.parts = viewParts{}, requestParts{}
		return &c
	case *vmiView:
		c := *v
		c.scanned, c.parts = viewParts{}, requestParts{}
		return &c
	}
	return view
}

// views make every view kvnet decodes admitted objects into.
var views = []func() any{
	func() any { return new(vmView) },
	func() any { return new(vmiView) },
	func() any { return new(podView) },
}

// v1Review is the review as the API server's decoder alone reads it.
func v1Review(raw []byte) (*review, error) {
	rv := &review{Request: &request{}}
	if err := apijson.V1(raw, rv); err != nil {
		return nil, err
	}
	rv.complete()
	return rv, nil
}

// agree checks decodeReview against the API server's decoder: the same
// answer for the review, and a view decoded in the review's pass equal to
// the object's v1 decode.
func agree(raw []byte, newView func() any) error {
	want, werr := v1Review(raw)
	var view any
	if newView != nil {
		view = newView()
	}
	got, err := decodeReview(raw, view)
	switch {
	case (err == nil) != (werr == nil):
		return fmt.Errorf("decodeReview error %v, the API server's decoder %v, on %q", err, werr, raw)
	case err != nil:
		return nil
	case got.APIVersion != want.APIVersion || got.Kind != want.Kind || !reflect.DeepEqual(got.Request.AdmissionRequest, want.Request.AdmissionRequest):
		return fmt.Errorf("decoders disagree on %q:\ngot  %#v\nwant %#v", raw, got.Request.AdmissionRequest, want.Request.AdmissionRequest)
	case !got.Request.Object.decoded:
		return nil
	}
	v1 := newView()
	if err := apijson.V1(got.Request.Object.raw, v1); err != nil {
		return fmt.Errorf("%T decoded in the review's pass, the API server's decoder refuses %q: %v", view, got.Request.Object.raw, err)
	}
	if !reflect.DeepEqual(withoutScanNotes(view), v1) {
		return fmt.Errorf("%T decoded in the review's pass differs on %q:\ngot  %#v\nwant %#v", view, raw, view, v1)
	}
	return nil
}

// FuzzDecodersAgree holds apijson's fast path to the API server's decoder
// on every type the webhooks decode: wherever v2 decodes an input, the API
// server's decoder gives the same value, whether the view is decoded on
// its own or in the review's pass, and the review's objects are the bytes
// v1 copies.
func FuzzDecodersAgree(f *testing.F) {
	for _, s := range agreeSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		for _, newView := range append(views, nil) {
			if err := agree(raw, newView); err != nil {
				t.Fatal(err)
			}
			if newView == nil {
				continue
			}
			if _, err := apijsontest.Agree(raw, newView); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A review from a real API server takes the fast path: its object is
// decoded in the review's pass and borrowed from the body, not copied.
// Without that, the benchmarks would measure the fallback.
func TestRealReviewsTakeTheFastPath(t *testing.T) {
	review, err := os.ReadFile("../test/loadtest/testdata/launcher-pod-review.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := agree(review, views[2]); err != nil {
		t.Fatal(err)
	}
	view := new(podView)
	rv, err := decodeReview(review, view)
	if err != nil {
		t.Fatal(err)
	}
	obj := rv.Request.Object.raw
	start := bytes.Index(review, obj)
	switch {
	case !rv.Request.Object.decoded || view.Metadata == nil || view.Metadata.Name == "":
		t.Fatalf("the pod's view was not decoded in the review's pass: %+v", view)
	case len(obj) == 0 || start < 0:
		t.Fatalf("object %q is not in the review", obj)
	case &review[start] != &obj[0]:
		t.Fatal("the object was copied, not borrowed")
	}
	if !apijson.Fast(review, rv) {
		t.Fatal("the review type is off apijson's fast path")
	}
	for _, newView := range views {
		if !apijson.Fast(obj, newView()) {
			t.Fatalf("%T is off apijson's fast path", newView())
		}
		if fast, err := apijsontest.Agree(obj, newView); err != nil || !fast {
			t.Fatalf("%T: fast=%v err=%v", newView(), fast, err)
		}
	}
}

// Every VM and VMI review of the golden inputs and examples is scanned,
// its view with it. A review the scan gave up on is still answered right,
// by the API server's decoder, only slower: this is where that shows.
func TestVMReviewsAreScanned(t *testing.T) {
	scanned := 0
	for _, raw := range agreeSeeds(t) {
		var probe struct {
			Request struct {
				Object struct{ Kind string }
			}
		}
		if json.Unmarshal(raw, &probe) != nil {
			continue
		}
		var view any
		switch probe.Request.Object.Kind {
		case "VirtualMachine":
			view = new(vmView)
		case "VirtualMachineInstance":
			view = new(vmiView)
		default:
			continue
		}
		rv := &review{Request: &request{Object: objectField{body: raw, view: view}, OldObject: objectField{body: raw}}}
		if err := scanReview(raw, rv); err != nil || !rv.Request.Object.decoded {
			t.Errorf("scan: %v, view decoded %v, on %s", err, rv.Request.Object.decoded, raw)
		}
		scanned++
	}
	if scanned < 5 {
		t.Fatalf("%d VM and VMI reviews among the seeds, want at least 5", scanned)
	}
	t.Logf("%d VM and VMI reviews scanned", scanned)
}

// interfaceView is a view a handler might one day read: a member decoded
// into an interface, whose integers the API server's decoder gives as
// int64 and v2 as float64.
type interfaceView struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec map[string]any `json:"spec"`
}

// A view that holds an interface is not decoded in the review's pass with
// v2: apijson's guard against interfaces must reach past the review's
// objects into the view, or its integers would change type.
func TestViewWithAnInterfaceDecodesAsTheAPIServer(t *testing.T) {
	raw := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","object":{"metadata":{"name":"x"},"spec":{"replicas":3,"nested":{"n":[1,2]}}}}}`)
	if err := agree(raw, func() any { return new(interfaceView) }); err != nil {
		t.Fatal(err)
	}
	view := new(interfaceView)
	rv, err := decodeReview(raw, view)
	if err != nil {
		t.Fatal(err)
	}
	got, dups, err := decodeView[interfaceView](rv.Request.Object.raw, nil, viewIfDecoded(rv, view))
	if err != nil || dups != nil {
		t.Fatal(err, dups)
	}
	if n, ok := got.Spec["replicas"].(int64); !ok || n != 3 {
		t.Fatalf("spec.replicas = %#v (%T), want int64 3 as the API server decodes it", got.Spec["replicas"], got.Spec["replicas"])
	}
}

func viewIfDecoded(rv *review, view any) any {
	if rv.Request.Object.decoded {
		return view
	}
	return nil
}

// The networks and interfaces most VMs write are read by tokens; a list
// with any other member is read by v2, and either way the list is what
// the API server's decoder reads.
func TestKubeVirtListsScanned(t *testing.T) {
	for _, c := range []struct {
		raw     string
		scanned bool
	}{
		{`{"spec":{"networks":[{"name":"default","pod":{}},{"name":"s","multus":{"networkName":"ns/storage","default":true}}],"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}},{"name":"s","bridge":{},"macAddress":"02:00:00:00:00:01","model":"virtio"},{"name":"v","binding":{"name":"vdpa"}},{"name":"f","sriov":{}}]}}}}`, true},
		// Members KubeVirt's types leave out when empty: written back
		// whole, these lists would lose them.
		{`{"spec":{"networks":[{"name":"s","multus":{"networkName":"ns/storage","default":false}}],"domain":{"devices":{"interfaces":[{"name":"s","bridge":{},"model":""}]}}}}`, false},
		{`{"spec":{"networks":null,"domain":{"devices":{"interfaces":[{"name":"s","bridge":{},"macAddress":""}]}}}}`, false},
		{`{"spec":{"networks":[],"domain":{"devices":{"interfaces":[]}}}}`, true},
		{`{"spec":{"networks":[{"name":"default","pod":{"vmNetworkCIDR":"10.1.0.0/24"}}],"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{},"ports":[{"port":80}]}]}}}}`, false},
		{`{"spec":{"networks":null,"domain":{"devices":{"interfaces":[{"name":"x","bootOrder":1,"binding":{"name":"b"}}]}}}}`, false},
		// A null source or binding is none, as the API server's decoder
		// reads it: not an empty one that writing the list back would add.
		{`{"spec":{"networks":[{"name":"a","multus":null}],"domain":{"devices":{"interfaces":[{"name":"a","binding":null}]}}}}`, false},
		// Members KubeVirt's types always write must be there: written
		// back whole, these lists would gain a name or a networkName.
		{`{"spec":{"networks":[{}],"domain":{"devices":{"interfaces":[{"bridge":{}}]}}}}`, false},
		{`{"spec":{"networks":[{"name":"a","multus":{}}],"domain":{"devices":{"interfaces":[{"name":"a","binding":{}}]}}}}`, false},
	} {
		view := new(vmiView)
		s := scanners.Get().(*scanner)
		s.buf = *bytes.NewBuffer([]byte(c.raw))
		s.dec.Reset(&s.buf)
		if err := view.scan(s); err != nil {
			t.Fatalf("%s: %v", c.raw, err)
		}
		v1 := new(vmiView)
		if err := apijson.V1([]byte(c.raw), v1); err != nil {
			t.Fatal(err)
		}
		if got := view.Spec.whole; got != (wholeLists{c.scanned, c.scanned}) {
			t.Errorf("%s: lists read whole %+v, want both %v", c.raw, got, c.scanned)
		}
		if !reflect.DeepEqual(withoutScanNotes(view), v1) {
			t.Errorf("%s:\nscan %#v\nv1   %#v", c.raw, view, v1)
		}
		var probe struct {
			Spec struct {
				Networks json.RawMessage `json:"networks"`
				Domain   struct {
					Devices struct {
						Interfaces json.RawMessage `json:"interfaces"`
					} `json:"devices"`
				} `json:"domain"`
			} `json:"spec"`
		}
		if err := json.Unmarshal([]byte(c.raw), &probe); err != nil {
			t.Fatal(err)
		}
		sub := new(scanner)
		sub.buf = *bytes.NewBuffer(probe.Spec.Networks)
		sub.dec.Reset(&sub.buf)
		_, nerr := scanElems(sub, (*scanner).network, nil)
		sub = new(scanner)
		sub.buf = *bytes.NewBuffer(probe.Spec.Domain.Devices.Interfaces)
		sub.dec.Reset(&sub.buf)
		_, ierr := scanElems(sub, (*scanner).iface, nil)
		if scanned := nerr == nil && ierr == nil; scanned != c.scanned {
			t.Errorf("%s: scanned by tokens %v (networks %v, interfaces %v), want %v", c.raw, scanned, nerr, ierr, c.scanned)
		}
	}
}

// The strings of a view are its own: a later review, read in place into
// the same reused body buffer and scanned by the same pooled scanner, must
// not change those of an earlier one still in use (keepText copies them
// into blocks that release drops rather than reuses).
func TestViewStringsOutliveTheNextReview(t *testing.T) {
	vm := func(name, label string) []byte {
		return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-` + name + `","operation":"CREATE",` +
			`"kind":{"group":"kubevirt.io","version":"v1","kind":"VirtualMachine"},"namespace":"tenant-a","name":"` + name + `",` +
			`"object":{"metadata":{"name":"` + name + `","namespace":"tenant-a","labels":{"app":"` + label + `"}},"spec":{"template":{"spec":{"networks":[{"name":"` + label + `","pod":{}}]}}}}}}`)
	}
	body := vm("first-vm", "first-label")
	first := new(vmView)
	rv, err := decodeReview(body, first)
	if err != nil || !rv.Request.Object.decoded {
		t.Fatalf("decoded %v: %v", rv != nil && rv.Request.Object.decoded, err)
	}
	copy(body, vm("other-vm", "other-label")) // the body buffer reused for the next request
	for range 3 {
		if _, err := decodeReview(vm("third-vm", "third-label"), new(vmView)); err != nil {
			t.Fatal(err)
		}
	}
	m := first.Metadata
	if m.Name != "first-vm" || m.Labels["app"] != "first-label" || first.Spec.Template.Spec.Networks[0].Name != "first-label" {
		t.Fatalf("the first view now holds name %q, label %q, network %q", m.Name, m.Labels["app"], first.Spec.Template.Spec.Networks[0].Name)
	}
}
