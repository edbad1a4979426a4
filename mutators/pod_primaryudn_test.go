package mutators

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/primaryudn"
)

const (
	udnNS = "tenant-u"
	// udnPrimary is a primary layer2 UDN as OVN-Kubernetes renders it.
	udnPrimary = `{"cniVersion":"1.0.0","name":"tenant-u_udn","type":"ovn-k8s-cni-overlay","topology":"layer2","role":"primary","subnets":"10.200.0.0/16,fd00:200::/64","allowPersistentIPs":true}`
	// udnDefault is the cluster default network's NAD, as OVN-Kubernetes creates it.
	udnDefault = `{"cniVersion":"0.4.0","name":"ovn-kubernetes","type":"ovn-k8s-cni-overlay"}`
	udnMAC     = "02:00:00:00:00:2a"
)

func udnSnapshot(primary string, withDefaultNAD bool) *lookup.Snapshot {
	var nads []nadv1.NetworkAttachmentDefinition
	mk := func(ns, name, cfg string) {
		nads = append(nads, nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: nadv1.NetworkAttachmentDefinitionSpec{Config: cfg}})
	}
	if primary != "" {
		mk(udnNS, "udn", primary)
	}
	if withDefaultNAD {
		mk("ovn-kubernetes", "default", udnDefault)
	}
	return lookup.NewSnapshot(nads, nil, nil)
}

// udnVMI is the VM-owned VMI "web" on the pod network "pn" with a MAC and
// the given network.kubevirt.io/addresses.
func udnVMI(addresses string) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{
		Namespace: udnNS, Name: "web", UID: "22222222-2222-2222-2222-222222222222",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web", UID: crVMUID, Controller: ptr.To(true)}},
	}}
	if addresses != "" {
		vmi.Annotations = map[string]string{primaryudn.AddressesAnnotation: addresses}
	}
	vmi.Spec.Networks = []kubevirtv1.Network{{Name: "pn", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
	vmi.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "pn", MacAddress: udnMAC, Binding: &kubevirtv1.PluginBinding{Name: "l2bridge"}}}
	return vmi
}

func udnPod(extra map[string]string) *corev1.Pod {
	a := map[string]string{kubevirtv1.DomainAnnotation: "web"}
	maps.Copy(a, extra)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: udnNS, Name: "virt-launcher-web-abcde", Annotations: a}}
}

func udnConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(y), "kvnet-system")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPrimaryUDN(t *testing.T) {
	on := udnConfig(t, "persistentIPs: {primaryUDN: {enabled: true}}")
	full := `[{"name":"default","namespace":"ovn-kubernetes","mac":"` + udnMAC + `","ipam-claim-reference":"web.pn"}]`
	foreign := &ipamv1alpha1.IPAMClaim{ObjectMeta: metav1.ObjectMeta{Namespace: udnNS, Name: "web.pn", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "33333333-3333-3333-3333-333333333333", Controller: ptr.To(true),
	}}}}
	held := func(ips ...string) *ipamv1alpha1.IPAMClaim {
		return &ipamv1alpha1.IPAMClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: udnNS, Name: "web.pn", OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "web", UID: crVMUID, Controller: ptr.To(true),
			}}},
			Status: ipamv1alpha1.IPAMClaimStatus{IPs: ips},
		}
	}
	noMAC := udnVMI("")
	noMAC.Spec.Domain.Devices.Interfaces[0].MacAddress = ""
	tests := map[string]struct {
		cfg        *config.Config
		facts      lookup.Facts
		vmi        *kubevirtv1.VirtualMachineInstance
		cache      []client.Object
		pod        map[string]string // annotations besides kubevirt.io/domain
		op         admissionv1.Operation
		old        map[string]string // the stored pod's annotations on UPDATE
		want       map[string]string // annotations kvnet adds or changes
		warning    string
		refused    string // part of a 403 message
		noVMIReads bool
	}{
		"element with claim and MAC, and the legacy annotation": {
			want: map[string]string{multus.DefaultNetworkAnnotation: full, primaryudn.LegacyClaimAnnotation: "web.pn"},
		},
		"IPs from network.kubevirt.io/addresses get the subnet's prefix": {
			vmi: udnVMI(`{"pn":["10.200.0.9","fd00:200::9"],"other":["1.2.3.4"]}`),
			want: map[string]string{
				multus.DefaultNetworkAnnotation:  `[{"name":"default","namespace":"ovn-kubernetes","ips":["10.200.0.9/16","fd00:200::9/64"],"mac":"` + udnMAC + `","ipam-claim-reference":"web.pn"}]`,
				primaryudn.LegacyClaimAnnotation: "web.pn",
			},
		},
		"IP outside the subnet: warning, claim and MAC still written": {
			vmi:     udnVMI(`{"pn":["192.168.1.1"]}`),
			want:    map[string]string{multus.DefaultNetworkAnnotation: full, primaryudn.LegacyClaimAnnotation: "web.pn"},
			warning: "in no subnet",
		},
		// OVN-Kubernetes fails a pod asking for IPs its claim does not hold.
		"IPs the claim holds: applied": {
			vmi:   udnVMI(`{"pn":["10.200.0.9","fd00:200::9"]}`),
			cache: []client.Object{held("10.200.0.9/16", "fd00:200::9/64")},
			want: map[string]string{
				multus.DefaultNetworkAnnotation:  `[{"name":"default","namespace":"ovn-kubernetes","ips":["10.200.0.9/16","fd00:200::9/64"],"mac":"` + udnMAC + `","ipam-claim-reference":"web.pn"}]`,
				primaryudn.LegacyClaimAnnotation: "web.pn",
			},
		},
		"IPs the claim does not hold: warning, claim and MAC still written": {
			vmi:   udnVMI(`{"pn":["10.200.0.9","fd00:200::9"]}`),
			cache: []client.Object{held("10.200.0.33/16", "fd00:200::33/64")},
			want:  map[string]string{multus.DefaultNetworkAnnotation: full, primaryudn.LegacyClaimAnnotation: "web.pn"}, warning: "already holds [10.200.0.33/16 fd00:200::33/64]",
		},
		"one family on a dual-stack network: warning, not applied": {
			vmi:  udnVMI(`{"pn":["10.200.0.9"]}`),
			want: map[string]string{multus.DefaultNetworkAnnotation: full, primaryudn.LegacyClaimAnnotation: "web.pn"}, warning: "takes exactly 1 IPv4 and 1 IPv6",
		},
		"no MAC asked for: claim only": {
			vmi: noMAC,
			want: map[string]string{
				multus.DefaultNetworkAnnotation:  `[{"name":"default","namespace":"ovn-kubernetes","ipam-claim-reference":"web.pn"}]`,
				primaryudn.LegacyClaimAnnotation: "web.pn",
			},
		},
		"no default-network NAD: legacy annotation only, MAC dropped with a warning": {
			facts: udnSnapshot(udnPrimary, false),
			want:  map[string]string{primaryudn.LegacyClaimAnnotation: "web.pn"}, warning: "does not exist",
		},
		// persistentIPs.primaryUDN.legacyClaimAnnotation: false, for an
		// OVN-Kubernetes that reads the element (OKEP-5233 deprecates the annotation).
		"legacy annotation off: element only": {
			cfg:  udnConfig(t, "persistentIPs: {primaryUDN: {enabled: true, legacyClaimAnnotation: false}}"),
			want: map[string]string{multus.DefaultNetworkAnnotation: full},
		},
		"legacy annotation off, no default-network NAD: nothing written, warned": {
			cfg:   udnConfig(t, "persistentIPs: {primaryUDN: {enabled: true, legacyClaimAnnotation: false}}"),
			facts: udnSnapshot(udnPrimary, false),
			want:  map[string]string{}, warning: "legacyClaimAnnotation is off, so nothing carries IPAMClaim web.pn",
		},
		"legacy annotation off, another claim in it: still refused": {
			cfg:     udnConfig(t, "persistentIPs: {primaryUDN: {enabled: true, legacyClaimAnnotation: false}}"),
			pod:     map[string]string{primaryudn.LegacyClaimAnnotation: "someone-else"},
			refused: `k8s.ovn.org/primary-udn-ipamclaim="someone-else"`,
		},
		"legacy annotation explicitly on": {
			cfg:  udnConfig(t, "persistentIPs: {primaryUDN: {enabled: true, legacyClaimAnnotation: true}}"),
			want: map[string]string{multus.DefaultNetworkAnnotation: full, primaryudn.LegacyClaimAnnotation: "web.pn"},
		},
		"another default-network NAD configured": {
			cfg:   udnConfig(t, "persistentIPs: {primaryUDN: {enabled: true, defaultNetworkNAD: ovn-kubernetes/default}}"),
			facts: udnSnapshot(udnPrimary, true),
			want:  map[string]string{multus.DefaultNetworkAnnotation: full, primaryudn.LegacyClaimAnnotation: "web.pn"},
		},
		"off by default": {cfg: udnConfig(t, ""), noVMIReads: true},
		"persistent IPs off": {
			cfg: udnConfig(t, "persistentIPs: {enabled: false, primaryUDN: {enabled: true}}"), noVMIReads: true,
		},
		"namespace without a primary network: VMI not even read": {facts: udnSnapshot("", true), noVMIReads: true},
		"layer3 primary network": {
			facts: udnSnapshot(strings.Replace(udnPrimary, "layer2", "layer3", 1), true), noVMIReads: true,
		},
		"claim of another controller: no reference": {
			cache: []client.Object{foreign}, warning: "controlled by another object",
		},
		"kvnet.io/skip": {pod: map[string]string{chain.SkipAnnotation: "true"}, noVMIReads: true},
		"the same element already there (reinvocation): nothing to do": {
			pod: map[string]string{multus.DefaultNetworkAnnotation: full, primaryudn.LegacyClaimAnnotation: "web.pn"},
		},
		"a partial element is completed, its other keys kept": {
			pod: map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","example.com/x":{"a":1}}]`},
			want: map[string]string{
				multus.DefaultNetworkAnnotation:  `[{"name":"default","namespace":"ovn-kubernetes","example.com/x":{"a":1},"mac":"` + udnMAC + `","ipam-claim-reference":"web.pn"}]`,
				primaryudn.LegacyClaimAnnotation: "web.pn",
			},
		},
		"another network as default: refused": {
			pod:     map[string]string{multus.DefaultNetworkAnnotation: "tenant-u/mine"},
			refused: `already carries v1.multus-cni.io/default-network="tenant-u/mine": it selects tenant-u/mine`,
		},
		"another claim in the element: refused": {
			pod:     map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","ipam-claim-reference":"other"}]`},
			refused: `"ipam-claim-reference" is "other", kvnet needs "web.pn"`,
		},
		"another MAC in the element: refused": {
			pod:     map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes","mac":"02:00:00:00:00:01"}]`},
			refused: `"mac" is "02:00:00:00:00:01"`,
		},
		"two elements: refused": {
			pod:     map[string]string{multus.DefaultNetworkAnnotation: `[{"name":"default","namespace":"ovn-kubernetes"},{"name":"x"}]`},
			refused: "selects 2 networks",
		},
		"unparsable: refused": {
			pod: map[string]string{multus.DefaultNetworkAnnotation: `[{"name":`}, refused: "does not parse",
		},
		"legacy annotation naming another claim: refused": {
			pod:     map[string]string{primaryudn.LegacyClaimAnnotation: "someone-else"},
			refused: `k8s.ovn.org/primary-udn-ipamclaim="someone-else"`,
		},
		"UPDATE that leaves a foreign element as stored: not refused": {
			op:   admissionv1.Update,
			pod:  map[string]string{multus.DefaultNetworkAnnotation: "tenant-u/mine", primaryudn.LegacyClaimAnnotation: "web.pn"},
			old:  map[string]string{multus.DefaultNetworkAnnotation: "tenant-u/mine", primaryudn.LegacyClaimAnnotation: "web.pn"},
			want: map[string]string{},
		},
		"UPDATE that sets a foreign element: refused": {
			op:      admissionv1.Update,
			pod:     map[string]string{multus.DefaultNetworkAnnotation: "tenant-u/mine"},
			old:     map[string]string{},
			refused: "tenant-u/mine",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, facts, vmi := tc.cfg, tc.facts, tc.vmi
			if cfg == nil {
				cfg = on
			}
			if facts == nil {
				facts = udnSnapshot(udnPrimary, true)
			}
			if vmi == nil {
				vmi = udnVMI("")
			}
			reads := 0
			cache := readCounter{Reader: crClient(append([]client.Object{vmi}, tc.cache...)...), vmiReads: &reads}
			pod := udnPod(tc.pod)
			before := maps.Clone(pod.Annotations)
			req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: udnNS, Pod: pod, Config: cfg, Facts: facts}
			if tc.op != "" {
				req.Operation = tc.op
				req.OldPod = udnPod(tc.old)
			}
			m := PrimaryUDNPod{Cache: cache}
			err := m.MutatePod(context.Background(), req)
			if tc.refused != "" {
				var r *chain.Refusal
				if !errors.As(err, &r) || r.Status().Code != http.StatusForbidden || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("err = %v, want a 403 containing %q", err, tc.refused)
				}
				if !strings.Contains(err.Error(), "web") {
					t.Errorf("refusal %q does not name the VM", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("MutatePod: %v", err)
			}
			if tc.noVMIReads && reads > 0 {
				t.Errorf("read the VMI %d times; nothing needed it", reads)
			}
			changed := map[string]string{}
			for k, v := range pod.Annotations {
				if before[k] != v {
					changed[k] = v
				}
			}
			if want := tc.want; fmt.Sprint(changed) != fmt.Sprint(want) && !(len(changed) == 0 && len(want) == 0) {
				t.Errorf("changed annotations\n got %v\nwant %v", changed, want)
			}
			if w := strings.Join(req.Warnings, "\n"); tc.warning != "" && !strings.Contains(w, tc.warning) || tc.warning == "" && w != "" {
				t.Errorf("warnings %q, want %q", w, tc.warning)
			}
			// Idempotent: a second pass (reinvocation) changes nothing more.
			after := maps.Clone(pod.Annotations)
			req.Warnings = nil
			if err := m.MutatePod(context.Background(), req); err != nil {
				t.Fatalf("second pass: %v", err)
			}
			if !maps.Equal(after, pod.Annotations) {
				t.Errorf("second pass changed\n %v\nto %v", after, pod.Annotations)
			}
		})
	}
}

// readCounter counts VMI reads, to show namespaces without a primary
// network cost no VMI read.
type readCounter struct {
	client.Reader
	vmiReads *int
}

func (r readCounter) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*kubevirtv1.VirtualMachineInstance); ok {
		*r.vmiReads++
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// A cache failure is kvnet's (a 500), never a refusal.
func TestPrimaryUDNLookupFailure(t *testing.T) {
	on := udnConfig(t, "persistentIPs: {primaryUDN: {enabled: true}}")
	req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: udnNS, Pod: udnPod(nil), Config: on, Facts: udnSnapshot(udnPrimary, true)}
	boom := apierrors.NewForbidden(ipamv1alpha1.SchemeGroupVersion.WithResource("ipamclaims").GroupResource(), "web.pn", errors.New("RBAC"))
	err := PrimaryUDNPod{Cache: failingClaims{Reader: crClient(udnVMI("")), err: boom}}.MutatePod(context.Background(), req)
	var r *chain.Refusal
	if err == nil || errors.As(err, &r) || !strings.Contains(err.Error(), "reading IPAMClaim") {
		t.Fatalf("err = %v, want kvnet's own error naming the claim read", err)
	}
}

type failingClaims struct {
	client.Reader
	err error
}

func (f failingClaims) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*ipamv1alpha1.IPAMClaim); ok {
		return f.err
	}
	return f.Reader.Get(ctx, key, obj, opts...)
}

// BenchmarkPrimaryUDN is the launcher-pod path in a namespace whose primary
// network is a UDN (cached VMI, element and legacy annotation written),
// next to what it costs every other namespace once switched on (the
// namespace's NADs looked at, no VMI read), and ClaimRefs on a four-network
// pod as the baseline of the same run: see the x-claimrefs metric.
func BenchmarkPrimaryUDN(b *testing.B) {
	ctx := context.Background()
	cfg := config.Config{PersistentIPs: config.PersistentIPs{PrimaryUDN: config.PrimaryUDN{Enabled: true}}}.Default("")
	vmi := udnVMI(`{"pn":["10.200.0.9"]}`)
	m := PrimaryUDNPod{Cache: cacheReader{client.ObjectKeyFromObject(vmi): vmi}}
	crVM := crVMI()
	cr := ClaimRefs{Cache: cacheReader{client.ObjectKeyFromObject(crVM): crVM}}
	crAnnotation := crElems("blue", "red", "plain", "gone")
	udn, none, crf := udnSnapshot(udnPrimary, true), udnSnapshot("", true), crFacts()
	run := func(b *testing.B, f func() error) float64 {
		b.ReportAllocs()
		start := time.Now()
		n := 0
		for b.Loop() {
			if err := f(); err != nil {
				b.Fatal(err)
			}
			n++
		}
		return float64(time.Since(start).Nanoseconds()) / float64(n)
	}
	var baseline float64
	b.Run("claimrefs-baseline", func(b *testing.B) {
		baseline = run(b, func() error {
			req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: crNS, Pod: crPod(crAnnotation), Config: &cfg, Facts: crf}
			return cr.MutatePod(ctx, req)
		})
	})
	for name, facts := range map[string]lookup.Facts{"primary-udn": udn, "no-primary-network": none} {
		b.Run(name, func(b *testing.B) {
			ns := run(b, func() error {
				req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: udnNS, Pod: udnPod(nil), Config: &cfg, Facts: facts}
				if err := m.MutatePod(ctx, req); err != nil {
					return err
				}
				if facts == udn && req.Pod.Annotations[multus.DefaultNetworkAnnotation] == "" {
					return fmt.Errorf("no element written")
				}
				return nil
			})
			if baseline > 0 {
				b.ReportMetric(ns/baseline, "x-claimrefs")
			}
		})
	}
}
