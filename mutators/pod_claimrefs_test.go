package mutators

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/internal/persistentips"
)

const (
	crNS    = "tenant-a"
	crVMUID = "11111111-1111-1111-1111-111111111111"
	crOVN   = `{"cniVersion":"1.0.0","name":"%s","type":"ovn-k8s-cni-overlay","topology":"layer2","allowPersistentIPs":true}`
)

func crScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = kubevirtv1.AddToScheme(s)
	_ = ipamv1alpha1.AddToScheme(s)
	return s
}

// crFacts: blue and red allow persistent IPs, plain does not; "gone" does not exist.
func crFacts() *lookup.Snapshot {
	mk := func(name, cfg string) nadv1.NetworkAttachmentDefinition {
		return nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: crNS, Name: name}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: cfg}}
	}
	return lookup.NewSnapshot([]nadv1.NetworkAttachmentDefinition{
		mk("blue", fmt.Sprintf(crOVN, "blue-net")),
		mk("red", fmt.Sprintf(crOVN, "red-net")),
		mk("plain", `{"cniVersion":"0.4.0","name":"plain","type":"bridge"}`),
	}, nil, nil)
}

// crVMI is a VM-owned VMI "web" with networks blue, red, plain and gone.
func crVMI() *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{
		Namespace: crNS, Name: "web", UID: "22222222-2222-2222-2222-222222222222",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web", UID: crVMUID, Controller: ptr.To(true)}},
	}}
	vmi.Spec.Networks = []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
	for _, n := range []string{"blue", "red", "plain", "gone"} {
		vmi.Spec.Networks = append(vmi.Spec.Networks, kubevirtv1.Network{Name: n, NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: n}}})
	}
	return vmi
}

// crElems is KubeVirt's annotation for crVMI, element by element.
func crElems(nets ...string) string {
	var parts []string
	for _, n := range nets {
		parts = append(parts, fmt.Sprintf(`{"name":%q,"namespace":%q,"interface":%q}`, n, crNS, persistentips.PodInterfaceName(n)))
	}
	return "[" + strings.Join(parts, ",") + "]"
}

func crPod(networks string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Namespace: crNS, Name: "virt-launcher-web-abcde",
		Labels:      map[string]string{"kubevirt.io": "virt-launcher"},
		Annotations: map[string]string{kubevirtv1.DomainAnnotation: "web", multus.NetworksAnnotation: networks},
	}}
}

func crRequest(pod *corev1.Pod, cfg *config.Config) *chain.PodRequest {
	if cfg == nil {
		d := config.Config{}.Default("")
		cfg = &d
	}
	return &chain.PodRequest{Operation: admissionv1.Create, Namespace: crNS, Pod: pod, Config: cfg, Facts: crFacts()}
}

func crClient(objs ...client.Object) client.Reader {
	return fake.NewClientBuilder().WithScheme(crScheme()).WithObjects(objs...).Build()
}

// refsOf maps element index to its ipam-claim-reference ("" when absent).
func refsOf(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	elems, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		t.Fatalf("stored annotation does not parse: %v", err)
	}
	out := make([]string, len(elems))
	for i, e := range elems {
		out[i] = e.String(multus.KeyIPAMClaimReference)
	}
	return out
}

func TestClaimRefs(t *testing.T) {
	foreign := &ipamv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: crNS, Name: "web.red", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "33333333-3333-3333-3333-333333333333", Controller: ptr.To(true),
	}}}}
	ours := &ipamv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: crNS, Name: "web.blue", OwnerReferences: []metav1.OwnerReference{
		persistentips.Owner{Kind: "VirtualMachine", Namespace: crNS, Name: "web", UID: crVMUID}.Ref(),
	}}}
	standalone := crVMI()
	standalone.OwnerReferences = nil
	standalone.Name = "solo"
	hotVMI := crVMI()
	hotVMI.Spec.Networks = append(hotVMI.Spec.Networks, kubevirtv1.Network{Name: "hot", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "blue"}}})
	off := config.Config{}.Default("")
	off.PersistentIPs.Enabled = ptr.To(false)

	tests := map[string]struct {
		networks  string
		domain    string
		cache     client.Reader
		api       client.Reader
		cfg       *config.Config
		wantRefs  []string
		unchanged bool
		warning   string
		// contains is a piece of the rewritten annotation, where the
		// position of a key matters.
		contains string
	}{
		"references claimable networks only; a missing NAD skips only itself": {
			networks: crElems("blue", "red", "plain", "gone"), cache: crClient(crVMI(), ours),
			wantRefs: []string{"web.blue", "web.red", "", ""},
		},
		"VMI not cached yet is read through the API": {
			networks: crElems("blue"), cache: crClient(), api: crClient(crVMI()),
			wantRefs: []string{"web.blue"},
		},
		"hotplugged network missing from the cached VMI: re-read through the API": {
			networks: crElems("blue", "hot"), cache: crClient(crVMI()), api: crClient(hotVMI),
			wantRefs: []string{"web.blue", "web.hot"},
		},
		"no VMI anywhere: left alone": {
			networks: crElems("blue"), cache: crClient(), api: crClient(), unchanged: true,
		},
		"claim controlled by another object is not referenced": {
			networks: crElems("blue", "red"), cache: crClient(crVMI(), foreign),
			wantRefs: []string{"web.blue", ""}, warning: "controlled by another object",
		},
		"ips set: skipped with a warning": {
			networks: `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","ips":["10.0.0.5/24"]}]`,
			cache:    crClient(crVMI()), unchanged: true, warning: `asks for fixed "ips"`,
		},
		"existing other reference is kept": {
			networks: `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","ipam-claim-reference":"mine"}]`,
			cache:    crClient(crVMI()), unchanged: true, warning: "already references",
		},
		"an empty reference, none to Multus, is filled in place": {
			networks: `[{"name":"blue","namespace":"tenant-a","ipam-claim-reference":"","interface":"` + persistentips.PodInterfaceName("blue") + `"}]`,
			cache:    crClient(crVMI()), wantRefs: []string{"web.blue"}, contains: `"ipam-claim-reference":"web.blue","interface"`,
		},
		"a null reference, none to Multus, is filled in place": {
			networks: `[{"name":"blue","namespace":"tenant-a","ipam-claim-reference":null,"interface":"` + persistentips.PodInterfaceName("blue") + `"}]`,
			cache:    crClient(crVMI()), wantRefs: []string{"web.blue"},
		},
		"a reference that is not a string is left for Multus to refuse": {
			networks: `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","ipam-claim-reference":{"name":"x"}}]`,
			cache:    crClient(crVMI()), unchanged: true, warning: "is not a string",
		},
		"already referenced: nothing to do": {
			networks: `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","ipam-claim-reference":"web.blue"}]`,
			cache:    crClient(crVMI()), unchanged: true,
		},
		"ordinal interface names of older KubeVirt": {
			networks: `[{"name":"blue","namespace":"tenant-a","interface":"net1"},{"name":"red","namespace":"tenant-a","interface":"net2"}]`,
			cache:    crClient(crVMI()), wantRefs: []string{"web.blue", "web.red"},
		},
		"comma form without interface, matched by NAD": {
			networks: "tenant-a/red", cache: crClient(crVMI()), wantRefs: []string{"web.red"},
		},
		"standalone VMI: claim named after the VMI": {
			networks: crElems("blue"), domain: "solo", cache: crClient(standalone), wantRefs: []string{"solo.blue"},
		},
		"feature off": {
			networks: crElems("blue"), cache: crClient(crVMI()), cfg: &off, unchanged: true,
		},
		"unreadable annotation: warning, no change": {
			networks: `[{"name":1}]`, cache: crClient(crVMI()), unchanged: true, warning: "cannot read",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := crPod(tc.networks)
			if tc.domain != "" {
				pod.Annotations[kubevirtv1.DomainAnnotation] = tc.domain
			}
			req := crRequest(pod, tc.cfg)
			m := ClaimRefs{Cache: tc.cache, API: tc.api}
			if err := m.MutatePod(context.Background(), req); err != nil {
				t.Fatalf("MutatePod: %v", err)
			}
			got := pod.Annotations[multus.NetworksAnnotation]
			if tc.unchanged && got != tc.networks {
				t.Fatalf("annotation changed:\n got %s\nwant %s", got, tc.networks)
			}
			if !strings.Contains(got, tc.contains) {
				t.Fatalf("annotation %s lacks %s", got, tc.contains)
			}
			if tc.wantRefs != nil {
				if refs := refsOf(t, pod); fmt.Sprint(refs) != fmt.Sprint(tc.wantRefs) {
					t.Fatalf("references = %q, want %q", refs, tc.wantRefs)
				}
			}
			if tc.warning != "" && !strings.Contains(strings.Join(req.Warnings, "\n"), tc.warning) {
				t.Fatalf("warnings %q lack %q", req.Warnings, tc.warning)
			}
			if tc.warning == "" && len(req.Warnings) > 0 {
				t.Fatalf("unexpected warnings %q", req.Warnings)
			}
			// Idempotent: a second run (reinvocation, or KubeVirt's UPDATE
			// of an already mutated pod) changes nothing.
			req2 := crRequest(pod, tc.cfg)
			req2.Operation = admissionv1.Update
			if err := m.MutatePod(context.Background(), req2); err != nil {
				t.Fatal(err)
			}
			if again := pod.Annotations[multus.NetworksAnnotation]; again != got {
				t.Fatalf("second run changed the annotation:\n%s\n%s", got, again)
			}
		})
	}
}

// Keys kvnet does not know, and their values, survive the rewrite exactly.
func TestClaimRefsKeepsUnknownKeys(t *testing.T) {
	in := `[{"name":"plain","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("plain") + `","example.com/x":{"b":[1,2],"a":null}},` +
		`{"cni-args":{"z":"1"},"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","mac":"02:00:00:00:00:01","example.org/y":"v"}]`
	pod := crPod(in)
	if err := (ClaimRefs{Cache: crClient(crVMI())}).MutatePod(context.Background(), crRequest(pod, nil)); err != nil {
		t.Fatal(err)
	}
	want := `[{"name":"plain","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("plain") + `","example.com/x":{"b":[1,2],"a":null}},` +
		`{"cni-args":{"z":"1"},"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","mac":"02:00:00:00:00:01","example.org/y":"v","ipam-claim-reference":"web.blue"}]`
	if got := pod.Annotations[multus.NetworksAnnotation]; got != want {
		t.Fatalf("annotation\n got %s\nwant %s", got, want)
	}
}

// FuzzClaimRefsRewrite: for any annotation the parser accepts, printing and
// parsing again keeps every key and value, and the claim-reference rewrite
// keeps every key it did not set.
func FuzzClaimRefsRewrite(f *testing.F) {
	f.Add(crElems("blue", "red", "plain"))
	f.Add(`[{"name":"blue","namespace":"tenant-a","interface":"net1","x.io/k":{"deep":[1,"2",null]}}]`)
	f.Add("tenant-a/blue@net1, red")
	f.Add(`[{"name":"red","ips":["10.0.0.1"]}]`)
	f.Add(`[{"name":"blue","ipam-claim-reference":"other","\u00e9.io/k":"\u2028"}]`)
	m := ClaimRefs{Cache: crClient(crVMI())}
	f.Fuzz(func(t *testing.T, annotation string) {
		elems, err := multus.Parse(annotation)
		if err != nil {
			return
		}
		printed, err := multus.Format(elems)
		if err != nil {
			t.Fatalf("Format: %v", err)
		}
		again, err := multus.Parse(printed)
		if err != nil {
			t.Fatalf("parse(print(x)) failed: %v\n%s", err, printed)
		}
		sameKeys(t, elems, again, "")
		pod := crPod(annotation)
		if err := m.MutatePod(context.Background(), crRequest(pod, nil)); err != nil {
			t.Fatalf("MutatePod: %v", err)
		}
		after, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
		if err != nil {
			t.Fatalf("mutated annotation does not parse: %v", err)
		}
		sameKeys(t, elems, after, multus.KeyIPAMClaimReference)
	})
}

// sameKeys checks that b has a's elements with the same keys in the same
// order and the same values; b may add the key added.
func sameKeys(t *testing.T, a, b []*multus.Element, added string) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%d elements became %d", len(a), len(b))
	}
	for i := range a {
		ka, kb := a[i].Keys(), b[i].Keys()
		if added != "" && !a[i].Has(added) && b[i].Has(added) {
			if kb[len(kb)-1] != added {
				t.Fatalf("element %d: %s not appended at the end: %v", i, added, kb)
			}
			kb = kb[:len(kb)-1]
		}
		if fmt.Sprint(ka) != fmt.Sprint(kb) {
			t.Fatalf("element %d keys %v became %v", i, ka, kb)
		}
		for _, k := range ka {
			if k == added && isNone(a[i].Raw(k)) {
				continue // "" or null, none to Multus: the added key filled in place
			}
			if !jsonEqual(a[i].Raw(k), b[i].Raw(k)) {
				t.Fatalf("element %d key %q: %s became %s", i, k, a[i].Raw(k), b[i].Raw(k))
			}
		}
	}
}

// isNone reports whether a raw value is "" or null, which Multus reads
// as no value.
func isNone(raw []byte) bool {
	var s string
	return json.Unmarshal(raw, &s) == nil && s == ""
}

func jsonEqual(a, b []byte) bool {
	var ca, cb bytes.Buffer
	if json.Compact(&ca, a) != nil || json.Compact(&cb, b) != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(ca.Bytes(), cb.Bytes())
}

// cacheReader stands in for the informer cache on the benchmark: a map
// lookup and a deep copy per Get, as controller-runtime's cache reader does.
// (The fake client's Get round-trips through JSON and would dominate.)
type cacheReader map[client.ObjectKey]client.Object

func (c cacheReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	src, ok := c[key]
	if !ok || fmt.Sprintf("%T", src) != fmt.Sprintf("%T", obj) {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	switch dst := obj.(type) {
	case *kubevirtv1.VirtualMachineInstance:
		src.(*kubevirtv1.VirtualMachineInstance).DeepCopyInto(dst)
	case *ipamv1alpha1.IPAMClaim:
		src.(*ipamv1alpha1.IPAMClaim).DeepCopyInto(dst)
	}
	return nil
}

func (c cacheReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return fmt.Errorf("not used")
}

// BenchmarkClaimRefs is the launcher-pod hot path: a cached VMI, four
// networks, two references to add.
func BenchmarkClaimRefs(b *testing.B) {
	vmi := crVMI()
	m := ClaimRefs{Cache: cacheReader{client.ObjectKeyFromObject(vmi): vmi}}
	annotation := crElems("blue", "red", "plain", "gone")
	cfg := config.Config{}.Default("")
	facts := crFacts()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		pod := crPod(annotation)
		req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: crNS, Pod: pod, Config: &cfg, Facts: facts}
		if err := m.MutatePod(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// Beside ipam-extensions (its webhook registered, under any configuration
// name), kvnet references no claim itself and records which networks it
// left to it, whether or not ipam-extensions has already referenced them.
func TestClaimRefsLeftToIPAMExtensions(t *testing.T) {
	ours := &ipamv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: crNS, Name: "web.blue", OwnerReferences: []metav1.OwnerReference{
		persistentips.Owner{Kind: "VirtualMachine", Namespace: crNS, Name: "web", UID: crVMUID}.Ref(),
	}}}
	referenced := `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","ipam-claim-reference":"web.blue"},` +
		`{"name":"red","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("red") + `"}]`
	for name, networks := range map[string]string{"kvnet first": crElems("blue", "red", "plain"), "ipam-extensions first (blue)": referenced} {
		t.Run(name, func(t *testing.T) {
			pod := crPod(networks)
			req := crRequest(pod, nil)
			facts := crFacts()
			facts.Webhooks = []admissionregv1.MutatingWebhookConfiguration{{ObjectMeta: metav1.ObjectMeta{Name: "any-name"},
				Webhooks: []admissionregv1.MutatingWebhook{{Name: peers.IPAMExtensionsWebhook, Rules: []admissionregv1.RuleWithOperations{{
					Operations: []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update},
					Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}}}}
			req.Facts = facts
			if err := (ClaimRefs{Cache: crClient(crVMI(), ours)}).MutatePod(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			if got := pod.Annotations[multus.NetworksAnnotation]; got != networks {
				t.Errorf("kvnet changed the annotation beside ipam-extensions:\n got %s\nwant %s", got, networks)
			}
			want := []chain.Change{{Mutator: "claim-refs", LeftTo: peers.IPAMExtensions, Networks: []string{"blue", "red"}}}
			if fmt.Sprint(req.Changes) != fmt.Sprint(want) {
				t.Errorf("recorded %+v, want %+v", req.Changes, want)
			}
		})
	}
}
