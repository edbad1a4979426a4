package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/validators"
	"github.com/kvnet/kvnet/webhook"
)

func toJSON(t testing.TB, y string) []byte {
	t.Helper()
	js, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// Undecodable objects are the client's fault: 400, never 500, from every
// VM/VMI handler.
func TestMalformedObjectIs400(t *testing.T) {
	hs := exampleHandlers(t)
	for _, raw := range []string{``, `null`, ` null `, `{`, `[]`, `"vm"`, `{"spec": 5}`, `{"metadata": []}`, `{"spec":{"networks":{},"template":{"spec":{"networks":{}}}}}`} {
		for _, path := range []string{webhook.PathMutateVM, webhook.PathMutateVMI, webhook.PathValidateVM, webhook.PathValidateVMI} {
			kind := chain.KindVM
			if strings.HasSuffix(path, "instances") {
				kind = chain.KindVMI
			}
			resp := hs[path].Handle(context.Background(), review(kind, admissionv1.Create, "tenant-a", []byte(raw), nil))
			if resp.Allowed || code(resp) != http.StatusBadRequest {
				t.Errorf("%s %q: allowed=%v code=%d, want a 400 denial", path, raw, resp.Allowed, code(resp))
			}
			if resp.Result == nil || resp.Result.Message == "" {
				t.Errorf("%s %q: no message", path, raw)
			}
		}
	}
	// An UPDATE whose old object is garbage still validates the new one
	// (ratcheting just drops nothing).
	vm := toJSON(t, `{apiVersion: kubevirt.io/v1, kind: VirtualMachine, metadata: {name: a, namespace: dpu}, spec: {template: {spec: {domain: {devices: {}}}}}}`)
	resp := hs[webhook.PathValidateVM].Handle(context.Background(), review(chain.KindVM, admissionv1.Update, "", vm, []byte(`{`)))
	if !resp.Allowed {
		t.Errorf("update with undecodable old object: %+v", resp.Result)
	}
}

type panicMutator struct{}

func (panicMutator) Name() string                                 { return "boom" }
func (panicMutator) Mutate(context.Context, *chain.Request) error { panic("nil map somewhere") }

type panicValidator struct{}

func (panicValidator) Name() string { return "boom" }
func (panicValidator) Validate(context.Context, *chain.Request) (field.ErrorList, error) {
	var m map[string]int
	//lint:ignore SA5000 the panic is what this validator is for
	m["x"]++
	return nil, nil
}

func TestPanicsBecome500(t *testing.T) {
	cfg := config.Static(exampleConfig(t))
	facts := exampleFacts(t)
	vm := toJSON(t, `{apiVersion: kubevirt.io/v1, kind: VirtualMachine, metadata: {name: a, namespace: dpu}, spec: {template: {spec: {domain: {devices: {}}}}}}`)
	for name, h := range map[string]handler{
		"mutator":   &webhook.VMMutateHandler{Kind: chain.KindVM, Config: cfg, Facts: facts, Mutators: []chain.VMMutator{mutators.NetworkInjector{}, panicMutator{}}},
		"validator": &webhook.VMValidateHandler{Kind: chain.KindVM, Config: cfg, Facts: facts, Validators: []chain.VMValidator{validators.Topology{}, panicValidator{}}},
		// A nil config source panics in the handler itself, outside any step.
		"handler": &webhook.VMMutateHandler{Kind: chain.KindVM, Facts: facts, Mutators: app.Chains(app.Capabilities{}).VM},
	} {
		t.Run(name, func(t *testing.T) {
			resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "", vm, nil))
			if resp.Allowed || code(resp) != http.StatusInternalServerError {
				t.Fatalf("allowed=%v code=%d, want a 500", resp.Allowed, code(resp))
			}
			if resp.Result.Message == "" {
				t.Fatal("a 500 without a message")
			}
		})
	}
}

// A user's mistake in kvnet.io/networks is a 422 with the annotation's
// field path, like virt-api's own refusals.
func TestBadNetworksAnnotationIs422(t *testing.T) {
	hs := exampleHandlers(t)
	vm := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu, annotations: {kvnet.io/networks: "dpu/vdpa-net@Bad_Name"}}
spec: {template: {spec: {domain: {devices: {}}}}}`)
	resp, _ := mutate(t, hs, chain.KindVM, admissionv1.Create, vm, nil)
	if resp.Allowed || code(resp) != http.StatusUnprocessableEntity {
		t.Fatalf("allowed=%v code=%d, want 422", resp.Allowed, code(resp))
	}
	d := resp.Result.Details
	if d == nil || len(d.Causes) == 0 {
		t.Fatalf("no causes in %+v", resp.Result)
	}
	for _, c := range d.Causes {
		if c.Field != "metadata.annotations[kvnet.io/networks]" || c.Type != "FieldValueInvalid" {
			t.Errorf("cause %+v: want FieldValueInvalid on metadata.annotations[kvnet.io/networks]", c)
		}
	}
	if chain.Kind(d.Kind) != chain.KindVM || d.Name != "a" || d.Group != "kubevirt.io" {
		t.Errorf("details = %+v, want kubevirt.io VirtualMachine a", d)
	}
}

// failingFacts stands for an unreachable cache: kvnet's failure, a 500 that
// says what was being looked up.
type failingFacts struct{}

func (failingFacts) NAD(_ context.Context, ref netattach.Ref) (*netattach.Info, error) {
	return nil, fmt.Errorf("reading NetworkAttachmentDefinition %s: %w", ref, errors.New("cache not synced"))
}
func (failingFacts) NamespaceLabels(context.Context, string) (map[string]string, error) {
	return nil, errors.New("reading namespace: cache not synced")
}
func (failingFacts) KubeVirt(context.Context) (*kubevirtv1.KubeVirt, error) {
	return nil, errors.New("listing KubeVirt CRs: cache not synced")
}
func (failingFacts) PrimaryNetworks(_ context.Context, ns string) ([]*netattach.Info, error) {
	return nil, fmt.Errorf("listing NetworkAttachmentDefinitions in %s: %w", ns, errors.New("cache not synced"))
}

func (failingFacts) IPAMClaim(_ context.Context, ns, name string) (*ipamv1alpha1.IPAMClaim, error) {
	return nil, fmt.Errorf("reading IPAMClaim %s/%s: %w", ns, name, errors.New("cache not synced"))
}

func (failingFacts) MigrationHolders(_ context.Context, role migrationid.Role, id string) ([]types.NamespacedName, error) {
	return nil, fmt.Errorf("listing the live VirtualMachineInstanceMigrations with %s %q: %w", role.Path(), id, errors.New("cache not synced"))
}

func (failingFacts) ResourceInjector(context.Context, string, map[string]string) (string, error) {
	return "", fmt.Errorf("listing MutatingWebhookConfigurations: %w", errors.New("cache not synced"))
}

func (failingFacts) IPAMExtensions(context.Context) (string, error) {
	return "", fmt.Errorf("listing MutatingWebhookConfigurations: %w", errors.New("cache not synced"))
}

func (failingFacts) MACHolders(context.Context, string) ([]lookup.MACHolder, error) {
	return nil, fmt.Errorf("listing the VirtualMachines with a MAC: %w", errors.New("cache not synced"))
}

func (failingFacts) MACPool(context.Context, string) (peers.MACPool, error) {
	return peers.MACPool{}, fmt.Errorf("listing MutatingWebhookConfigurations: %w", errors.New("cache not synced"))
}

func TestLookupFailureIs500WithContext(t *testing.T) {
	hs := webhook.NewHandlers(config.Static(exampleConfig(t)), failingFacts{}, app.Chains(app.Capabilities{}))
	vm := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu, annotations: {kvnet.io/networks: "dpu/vdpa-net@dp"}}
spec: {template: {spec: {domain: {devices: {}}}}}`)
	for _, path := range []string{webhook.PathMutateVM, webhook.PathValidateVM} {
		obj := vm
		if path == webhook.PathValidateVM {
			obj = toJSON(t, `{metadata: {name: a, namespace: dpu}, spec: {template: {spec: {networks: [{name: dp, multus: {networkName: vdpa-net}}]}}}}`)
		}
		resp := hs[path].Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "", obj, nil))
		if resp.Allowed || code(resp) != http.StatusInternalServerError {
			t.Fatalf("%s: allowed=%v code=%d, want 500", path, resp.Allowed, code(resp))
		}
		if !strings.Contains(resp.Result.Message, "cache not synced") || !strings.Contains(resp.Result.Message, "dpu/vdpa-net") && !strings.Contains(resp.Result.Message, "namespace") {
			t.Errorf("%s: message %q does not say what was looked up", path, resp.Result.Message)
		}
	}
}

type handler interface {
	Handle(ctx context.Context, req admission.Request) admission.Response
}

func TestSkips(t *testing.T) {
	hs := exampleHandlers(t)
	cases := map[string]struct {
		kind chain.Kind
		obj  string
		op   admissionv1.Operation
	}{
		"excluded namespace": {chain.KindVM, `{metadata: {name: a, namespace: kvnet-system, labels: {app.kubernetes.io/component: database}}, spec: {template: {spec: {}}}}`, admissionv1.Create},
		"kvnet.io/skip":      {chain.KindVM, `{metadata: {name: a, namespace: tenant-a, annotations: {kvnet.io/skip: "true", kvnet.io/networks: ovn-attach}}, spec: {template: {spec: {}}}}`, admissionv1.Create},
		"VMI owned by a VM":  {chain.KindVMI, `{metadata: {name: a, namespace: tenant-a, ownerReferences: [{apiVersion: kubevirt.io/v1, kind: VirtualMachine, name: a, uid: u, controller: true}]}, spec: {}}`, admissionv1.Create},
		"DELETE":             {chain.KindVM, `{metadata: {name: a, namespace: tenant-a}}`, admissionv1.Delete},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			resp, _ := mutate(t, hs, c.kind, c.op, toJSON(t, c.obj), nil)
			if !resp.Allowed || len(resp.Patches) != 0 {
				t.Fatalf("allowed=%v patches=%v, want allowed untouched", resp.Allowed, resp.Patches)
			}
		})
	}
	// A standalone VMI is mutated like a VM's template.
	vmi := toJSON(t, `{apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, metadata: {name: a, namespace: tenant-a}, spec: {domain: {devices: {}}}}`)
	resp, out := mutate(t, hs, chain.KindVMI, admissionv1.Create, vmi, nil)
	if !resp.Allowed || len(resp.Patches) == 0 || !strings.Contains(string(out), `"storage"`) {
		t.Fatalf("standalone VMI not mutated: %+v\n%s", resp.Result, out)
	}
}

// A VMI a VM controls is not validated again, even when it is invalid: the VM
// was validated, or opted out with kvnet.io/skip, which KubeVirt does not
// copy to the VMI. A standalone VMI with the same spec is refused.
func TestValidatorLeavesVMOwnedVMIs(t *testing.T) {
	hs := exampleHandlers(t)
	h := hs[webhook.PathValidateVMI]
	spec := `spec: {domain: {devices: {interfaces: [{name: x, binding: {name: nosuchplugin}}]}}, networks: [{name: x, pod: {}}]}}`
	owned := toJSON(t, `{apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, metadata: {name: a, namespace: tenant-a, ownerReferences: [{apiVersion: kubevirt.io/v1, kind: VirtualMachine, name: a, uid: u, controller: true}]}, `+spec)
	if resp := h.Handle(context.Background(), review(chain.KindVMI, admissionv1.Create, "", owned, nil)); !resp.Allowed {
		t.Fatalf("VM-owned VMI refused: %+v", resp.Result)
	}
	standalone := toJSON(t, `{apiVersion: kubevirt.io/v1, kind: VirtualMachineInstance, metadata: {name: a, namespace: tenant-a}, `+spec)
	if resp := h.Handle(context.Background(), review(chain.KindVMI, admissionv1.Create, "", standalone, nil)); resp.Allowed {
		t.Fatalf("standalone VMI with an undeclared plugin admitted")
	}
}

// On UPDATE an error the stored object already had does not block the
// change; a new one does.
func TestValidatorRatchets(t *testing.T) {
	hs := exampleHandlers(t)
	h := hs[webhook.PathValidateVM]
	old := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu}
spec:
  runStrategy: Halted
  template:
    spec:
      domain: {devices: {interfaces: [{name: gone, bridge: {}}]}}
      networks: [{name: gone, multus: {networkName: deleted-nad}}]`)
	edited := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu, labels: {edited: "yes"}}
spec:
  runStrategy: Always
  template:
    spec:
      domain: {devices: {interfaces: [{name: gone, bridge: {}}]}}
      networks: [{name: gone, multus: {networkName: deleted-nad}}]`)
	worse := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: gone, bridge: {}}, {name: orphan, bridge: {}}]}}
      networks: [{name: gone, multus: {networkName: deleted-nad}}]`)

	if resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "", old, nil)); resp.Allowed || code(resp) != 422 {
		t.Fatalf("CREATE with a missing NAD: allowed=%v code=%d, want 422", resp.Allowed, code(resp))
	}
	if resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Update, "", edited, old)); !resp.Allowed {
		t.Fatalf("UPDATE keeping the old error was refused: %+v", resp.Result)
	}
	resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Update, "", worse, old))
	if resp.Allowed || code(resp) != 422 {
		t.Fatalf("UPDATE adding an error: allowed=%v code=%d, want 422", resp.Allowed, code(resp))
	}
	causes := resp.Result.Details.Causes
	if len(causes) != 1 || causes[0].Field != "spec.template.spec.domain.devices.interfaces[1].name" {
		t.Fatalf("causes = %+v, want only the new interfaces[1].name error", causes)
	}
}

// Ratcheting keys errors by network name, not list index: inserting a
// network before one whose NAD was deleted shifts its index, and the error
// it already had must not read as new. (It was keyed by error text, index
// included, and this UPDATE was refused with a 422 before.)
func TestValidatorRatchetsAcrossIndexShifts(t *testing.T) {
	h := exampleHandlers(t)[webhook.PathValidateVM]
	old := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: gone, bridge: {}}]}}
      networks: [{name: gone, multus: {networkName: deleted-nad}}]`)
	inserted := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: default, masquerade: {}}, {name: gone, bridge: {}}]}}
      networks: [{name: default, pod: {}}, {name: gone, multus: {networkName: deleted-nad}}]`)
	if resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Update, "", inserted, old)); !resp.Allowed {
		t.Fatalf("inserting a network before the broken one was refused: %+v", resp.Result)
	}
	// Removing it again shifts the other way.
	if resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Update, "", old, inserted)); !resp.Allowed {
		t.Fatalf("removing the earlier network was refused: %+v", resp.Result)
	}
	// A new broken network at the old index is still new.
	worse := toJSON(t, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: a, namespace: dpu}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: other, bridge: {}}, {name: gone, bridge: {}}]}}
      networks: [{name: other, multus: {networkName: deleted-nad}}, {name: gone, multus: {networkName: deleted-nad}}]`)
	resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Update, "", worse, old))
	if resp.Allowed || code(resp) != 422 {
		t.Fatalf("a new broken network: allowed=%v code=%d, want 422", resp.Allowed, code(resp))
	}
	if causes := resp.Result.Details.Causes; len(causes) != 1 || causes[0].Field != "spec.template.spec.networks[0].multus.networkName" {
		t.Fatalf("causes = %+v, want only the new networks[0] error", causes)
	}
}
