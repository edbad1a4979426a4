package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/benchmark"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/webhook"
)

// benchVM ends up with four Multus networks: two from the example rules
// (storage bridge, SR-IOV), two from its annotation (kube-ovn with the
// default route, vDPA). Disks, volumes and cloud-init make it the size of a
// real VM, since decoding and diffing whole objects is what costs.
const benchVM = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: bench
  namespace: tenant-a
  labels: {app.kubernetes.io/component: database, app: bench, tier: backend}
  annotations:
    kvnet.io/networks: '[{"name":"ovn","nad":"ovn-attach","defaultRoute":true},{"name":"dp","nad":"dpu/vdpa-net"}]'
    description: a database VM used to measure kvnet's admission path
spec:
  runStrategy: Always
  dataVolumeTemplates:
    - metadata: {name: bench-data}
      spec:
        storage: {resources: {requests: {storage: 50Gi}}, storageClassName: fast}
        source: {blank: {}}
  template:
    metadata:
      labels: {kubevirt.io/vm: bench, app: bench}
      annotations: {example.com/owner: team-a}
    spec:
      evictionStrategy: LiveMigrate
      terminationGracePeriodSeconds: 180
      nodeSelector: {kubernetes.io/arch: amd64}
      tolerations: [{key: dedicated, operator: Equal, value: db, effect: NoSchedule}]
      domain:
        cpu: {cores: 4, sockets: 1, threads: 1, model: host-passthrough}
        machine: {type: q35}
        firmware: {bootloader: {efi: {secureBoot: false}}}
        features: {acpi: {}, smm: {enabled: true}}
        devices:
          autoattachGraphicsDevice: false
          rng: {}
          disks:
            - {name: root, disk: {bus: virtio}, bootOrder: 1}
            - {name: data, disk: {bus: virtio}}
            - {name: scratch, disk: {bus: virtio}}
            - {name: cloudinit, disk: {bus: virtio}}
        resources: {requests: {memory: 8Gi, cpu: "4"}, limits: {memory: 8Gi}}
      volumes:
        - {name: root, containerDisk: {image: quay.io/containerdisks/fedora:41}}
        - {name: data, dataVolume: {name: bench-data}}
        - {name: scratch, emptyDisk: {capacity: 10Gi}}
        - name: cloudinit
          cloudInitNoCloud:
            userData: |
              #cloud-config
              users:
                - name: admin
                  sudo: ALL=(ALL) NOPASSWD:ALL
                  ssh_authorized_keys:
                    - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJ7oJ0Hc3l3Ew2wq7mJ0y9xI3u7l9x0kQvF2tYB6M3aQ admin@example.com
              packages: [postgresql-server, postgresql-contrib, chrony, tuned]
              runcmd:
                - [systemctl, enable, --now, chronyd]
                - [postgresql-setup, --initdb]
                - [systemctl, enable, --now, postgresql]
              write_files:
                - path: /etc/sysctl.d/99-db.conf
                  content: |
                    vm.swappiness = 1
                    net.core.somaxconn = 4096
`

// reviewBytes is the AdmissionReview the API server would POST.
func reviewBytes(b testing.TB, obj []byte, op admissionv1.Operation, old []byte) []byte {
	r := review(chain.KindVM, op, "", obj, old)
	ar := admissionv1.AdmissionReview{Request: &r.AdmissionRequest}
	ar.APIVersion, ar.Kind = "admission.k8s.io/v1", "AdmissionReview"
	out, err := json.Marshal(ar)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// serve is the edge both contenders share: decode the AdmissionReview, call
// the handler, encode the response review.
func serve(b testing.TB, body []byte, h func(context.Context, admission.Request) admission.Response) admission.Response {
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &ar); err != nil {
		b.Fatal(err)
	}
	resp := h(context.Background(), admission.Request{AdmissionRequest: *ar.Request})
	if err := resp.Complete(admission.Request{AdmissionRequest: *ar.Request}); err != nil {
		b.Fatal(err)
	}
	out := admissionv1.AdmissionReview{TypeMeta: ar.TypeMeta, Response: &resp.AdmissionResponse}
	if _, err := json.Marshal(out); err != nil {
		b.Fatal(err)
	}
	return resp
}

// baselineMutator is the conventional controller-runtime webhook: the
// admission.Decoder decodes into the typed VM, the same chain runs on it,
// and admission.PatchResponseFromRaw diffs the whole raw request against the
// whole re-marshalled object.
type baselineMutator struct {
	decoder admission.Decoder
	cfg     *config.Config
	facts   lookup.Facts
}

func newBaseline(b testing.TB) *baselineMutator {
	s := runtime.NewScheme()
	if err := kubevirtv1.AddToScheme(s); err != nil {
		b.Fatal(err)
	}
	return &baselineMutator{decoder: admission.NewDecoder(s), cfg: exampleConfig(b), facts: exampleFacts(b)}
}

func (m *baselineMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	var vm kubevirtv1.VirtualMachine
	if err := m.decoder.Decode(req, &vm); err != nil {
		return admission.Errored(400, err)
	}
	if vm.Spec.Template == nil {
		vm.Spec.Template = &kubevirtv1.VirtualMachineInstanceTemplateSpec{}
	}
	cr := &chain.Request{
		Operation: req.Operation, Kind: chain.KindVM, Namespace: req.Namespace, Name: vm.Name,
		Meta: &vm.ObjectMeta, TemplateMeta: &vm.Spec.Template.ObjectMeta, Spec: &vm.Spec.Template.Spec,
		SpecPath: field.NewPath("spec", "template", "spec"), TemplateMetaPath: field.NewPath("spec", "template", "metadata"),
		Config: m.cfg, Facts: m.facts,
	}
	if err := chain.RunVMMutators(ctx, cr, app.Chains(app.Capabilities{}).VM); err != nil {
		return admission.Errored(500, err)
	}
	marshalled, err := json.Marshal(&vm)
	if err != nil {
		return admission.Errored(500, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, marshalled)
}

// Both contenders produce the same object from the benchmark VM, so the
// benchmark compares equal work.
func TestBaselineEquivalent(t *testing.T) {
	raw := toJSON(t, benchVM)
	body := reviewBytes(t, raw, admissionv1.Create, nil)
	kv := serve(t, body, exampleHandlers(t)[webhook.PathMutateVM].Handle)
	base := serve(t, body, newBaseline(t).Handle)
	a, b := applyResponse(t, raw, kv), applyResponse(t, raw, base)
	var x, y map[string]any
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	// The baseline's whole-object diff also adds the typed struct's empty
	// "status": {}, which raw lacks; that is its only difference.
	if st, ok := y["status"].(map[string]any); ok && len(st) == 0 {
		delete(y, "status")
	}
	if !reflect.DeepEqual(x, y) {
		t.Fatalf("kvnet and baseline disagree:\n kvnet    %s\n baseline %s", a, b)
	}
	var vm kubevirtv1.VirtualMachine
	if err := json.Unmarshal(a, &vm); err != nil {
		t.Fatal(err)
	}
	var multus int
	for _, n := range vm.Spec.Template.Spec.Networks {
		if n.Multus != nil {
			multus++
		}
	}
	if multus != 4 {
		t.Fatalf("benchmark VM has %d Multus networks after mutation, want 4", multus)
	}
}

// baselineNsOp holds the baseline's ns/op per benchmark, measured earlier
// in the same run, for the kvnet sub-benchmark's ratio.
var baselineNsOp = map[string]float64{}

func benchPair(b *testing.B, name string, body []byte, kvnet, baseline func(context.Context, admission.Request) admission.Response) {
	b.Run("baseline-controller-runtime", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(b, body, baseline)
		}
		baselineNsOp[name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("kvnet", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(b, body, kvnet)
		}
		if base := baselineNsOp[name]; base > 0 {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/base, "ns/op-vs-baseline")
		}
	})
}

// BenchmarkMutateVM4Networks: a VM CREATE that gains four networks, through
// the full handler (AdmissionReview -> decode -> chain -> patch -> response).
func BenchmarkMutateVM4Networks(b *testing.B) {
	raw := toJSON(b, benchVM)
	body := reviewBytes(b, raw, admissionv1.Create, nil)
	benchPair(b, "create", body, exampleHandlers(b)[webhook.PathMutateVM].Handle, newBaseline(b).Handle)
}

// BenchmarkMutateVMNoChange: the common UPDATE of a VM kvnet already
// mutated (KubeVirt's own writes), which changes nothing.
func BenchmarkMutateVMNoChange(b *testing.B) {
	hs := exampleHandlers(b)
	raw := toJSON(b, benchVM)
	_, mutated := mutate(b, hs, chain.KindVM, admissionv1.Create, raw, nil)
	body := reviewBytes(b, mutated, admissionv1.Update, mutated)
	benchPair(b, "noop-update", body, hs[webhook.PathMutateVM].Handle, newBaseline(b).Handle)
}

// BenchmarkValidateVM4Networks: the validating handler on the mutated VM.
func BenchmarkValidateVM4Networks(b *testing.B) {
	hs := exampleHandlers(b)
	_, mutated := mutate(b, hs, chain.KindVM, admissionv1.Create, toJSON(b, benchVM), nil)
	body := reviewBytes(b, mutated, admissionv1.Create, nil)
	b.ReportAllocs()
	for b.Loop() {
		if resp := serve(b, body, hs[webhook.PathValidateVM].Handle); !resp.Allowed {
			b.Fatalf("refused: %v", resp.Result)
		}
	}
}

// floorCPUNsOp holds the floor's CPU ns/op per benchmark, measured just
// before kvnet's in the same run.
var floorCPUNsOp = map[string]float64{}

// benchHTTP posts body to each handler in turn, the floor (controller-
// runtime's admission.Webhook around a handler that allows everything
// without reading the object) first, and reports cpu-ns/op for each and,
// for the others, x-floor-cpu: the floor's CPU per request over theirs
// (the goal for kvnet is at least 0.7).
func benchHTTP(b *testing.B, name string, body []byte, handlers []namedHandler) {
	floor := &admission.Webhook{Handler: admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})}
	for _, h := range append([]namedHandler{{"floor", floor}}, handlers...) {
		b.Run(name+"/"+h.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := benchmark.CPUTime()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				w := httptest.NewRecorder()
				h.h.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
			cpu := float64((benchmark.CPUTime() - cpu0).Nanoseconds()) / float64(b.N)
			b.ReportMetric(cpu, "cpu-ns/op")
			if h.name == "floor" {
				floorCPUNsOp[name] = cpu
			} else if f := floorCPUNsOp[name]; f > 0 {
				b.ReportMetric(f/cpu, "x-floor-cpu")
			}
		})
	}
}

type namedHandler struct {
	name string
	h    http.Handler
}

// BenchmarkEdge: kvnet's Edge around a do-nothing handler, and around the
// VM mutating and validating handlers, against the floor on the same
// bodies (the VM gaining four networks, and the VM after kvnet's patch).
func BenchmarkEdge(b *testing.B) {
	hs := exampleHandlers(b)
	raw := toJSON(b, benchVM)
	nothing := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	}))
	benchHTTP(b, "create", reviewBytes(b, raw, admissionv1.Create, nil), []namedHandler{
		{"edge-nothing", nothing}, {"kvnet-mutate", webhook.Webhook(hs[webhook.PathMutateVM])},
	})
	_, mutated := mutate(b, hs, chain.KindVM, admissionv1.Create, raw, nil)
	benchHTTP(b, "validate", reviewBytes(b, mutated, admissionv1.Create, nil), []namedHandler{
		{"edge-nothing", nothing}, {"kvnet-validate", webhook.Webhook(hs[webhook.PathValidateVM])},
	})
}
