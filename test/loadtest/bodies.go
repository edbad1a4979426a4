package loadtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/requested"
	"github.com/kvnet/kvnet/webhook"
)

// VM is a database VM in tenant-a that gains four Multus networks: the
// storage bridge and an SR-IOV VF from the rules, kube-ovn (with the default
// route) and vDPA from its annotation. Disks, volumes and cloud-init give it
// a real VM's size.
const VM = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: bench
  namespace: tenant-a
  labels: {app.kubernetes.io/component: database, app: bench}
  annotations:
    kvnet.io/networks: '[{"name":"ovn","nad":"ovn-attach","defaultRoute":true},{"name":"dp","nad":"dpu/vdpa-net"}]'
spec:
  runStrategy: Always
  template:
    metadata:
      labels: {kubevirt.io/vm: bench}
    spec:
      evictionStrategy: LiveMigrate
      domain:
        cpu: {cores: 4}
        devices:
          disks:
            - {name: root, disk: {bus: virtio}}
            - {name: cloudinit, disk: {bus: virtio}}
        resources: {requests: {memory: 8Gi}}
      volumes:
        - {name: root, containerDisk: {image: quay.io/containerdisks/fedora:41}}
        - name: cloudinit
          cloudInitNoCloud:
            userData: |
              #cloud-config
              packages: [postgresql-server, chrony]
              runcmd: [[systemctl, enable, --now, postgresql]]
`

// VMWithPodNetwork is VM declaring its pod network (masquerade) itself, as
// most VMs do: the networks kvnet adds are appended to lists the object
// has, where VM's are added whole.
const VMWithPodNetwork = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: bench-podnet
  namespace: tenant-a
  labels: {app.kubernetes.io/component: database, app: bench}
  annotations:
    kvnet.io/networks: '[{"name":"ovn","nad":"ovn-attach","defaultRoute":true},{"name":"dp","nad":"dpu/vdpa-net"}]'
spec:
  runStrategy: Always
  template:
    metadata:
      labels: {kubevirt.io/vm: bench-podnet}
    spec:
      evictionStrategy: LiveMigrate
      domain:
        cpu: {cores: 4}
        devices:
          interfaces: [{name: default, masquerade: {}}]
          disks:
            - {name: root, disk: {bus: virtio}}
            - {name: cloudinit, disk: {bus: virtio}}
        resources: {requests: {memory: 8Gi}}
      networks: [{name: default, pod: {}}]
      volumes:
        - {name: root, containerDisk: {image: quay.io/containerdisks/fedora:41}}
        - name: cloudinit
          cloudInitNoCloud:
            userData: |
              #cloud-config
              packages: [postgresql-server, chrony]
`

// Body is one webhook's request: the AdmissionReview the API server would
// POST, and how to tell that kvnet's answer is right.
type Body struct {
	// Name identifies the body on the command line and in reports.
	Name string
	// Path is the kvnet webhook it goes to.
	Path   string
	Review []byte
	// Check verifies the object after kvnet's patch (nil: no patch expected).
	Check func(patched []byte) error
}

// Bodies are the requests of every fixture webhook. The validating bodies
// are the mutating ones after kvnet's own patch, as the API server sends them.
func (f *Fixture) Bodies() ([]Body, error) {
	hs := f.Handlers()
	vm, err := yaml.YAMLToJSON([]byte(VM))
	if err != nil {
		return nil, err
	}
	vmi, err := vmiOf(vm)
	if err != nil {
		return nil, err
	}
	out := []Body{{
		Name: "launcher-pod", Path: webhook.PathMutateLauncherPods, Review: LauncherPodReview,
		Check: checkClaimRefs,
	}}
	for _, k := range []struct {
		name, kind, resource, mutate, validate string
		obj                                    []byte
	}{
		{"vm", "VirtualMachine", "virtualmachines", webhook.PathMutateVM, webhook.PathValidateVM, vm},
		{"vmi", "VirtualMachineInstance", "virtualmachineinstances", webhook.PathMutateVMI, webhook.PathValidateVMI, vmi},
	} {
		review, err := Review(metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: k.kind}, k.resource, "tenant-a", "bench", k.obj)
		if err != nil {
			return nil, err
		}
		mutated, err := admitOnce(webhook.Webhook(hs[k.mutate]), review, k.obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", k.name, err)
		}
		if err := checkNetworks(k.kind)(mutated); err != nil {
			return nil, fmt.Errorf("%s: %w", k.name, err)
		}
		vreview, err := Review(metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: k.kind}, k.resource, "tenant-a", "bench", mutated)
		if err != nil {
			return nil, err
		}
		out = append(out,
			Body{Name: k.name, Path: k.mutate, Review: review, Check: checkNetworks(k.kind)},
			Body{Name: k.name + "-validate", Path: k.validate, Review: vreview},
		)
		if k.kind == "VirtualMachineInstance" {
			status, err := migrationStatusReview(mutated)
			if err != nil {
				return nil, err
			}
			out = append(out, Body{Name: "migration-status", Path: webhook.PathMutateVMIMigrationStatus, Review: status, Check: checkMigrationStatus})
		}
	}
	podnet, err := yaml.YAMLToJSON([]byte(VMWithPodNetwork))
	if err != nil {
		return nil, err
	}
	review, err := Review(metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachine"}, "virtualmachines", "tenant-a", "bench-podnet", podnet)
	if err != nil {
		return nil, err
	}
	out = append(out, Body{Name: "vm-podnet", Path: webhook.PathMutateVM, Review: review, Check: checkNetworks("VirtualMachine")})
	pod, err := yaml.YAMLToJSON([]byte(VirtHandlerPod))
	if err != nil {
		return nil, err
	}
	review, err = Review(metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, "pods", "kubevirt", "", pod)
	if err != nil {
		return nil, err
	}
	out = append(out, Body{Name: "virt-handler-pod", Path: webhook.PathMutateMigrationPods, Review: review})
	return out, nil
}

// vmiOf is the standalone VMI with the VM's metadata and template spec.
func vmiOf(vm []byte) ([]byte, error) {
	var v struct {
		Metadata json.RawMessage `json:"metadata"`
		Spec     struct {
			Template struct {
				Spec json.RawMessage `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(vm, &v); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": v.Metadata, "spec": v.Spec.Template.Spec})
}

// Review is the AdmissionReview for a CREATE of obj.
func Review(gvk metav1.GroupVersionKind, resource, namespace, name string, obj []byte) ([]byte, error) {
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "00000000-0000-0000-0000-000000000000", Kind: gvk,
			Resource: metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resource},
			Name:     name, Namespace: namespace, Operation: admissionv1.Create,
			UserInfo: authenticationUser(),
			Object:   runtime.RawExtension{Raw: obj},
		},
	}
	return json.Marshal(ar)
}

// admitOnce posts review to h and returns obj with the answer's patch applied.
func admitOnce(h http.Handler, review, obj []byte) ([]byte, error) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, newRequest("/", review))
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &ar); err != nil || ar.Response == nil {
		return nil, fmt.Errorf("undecodable answer %q: %v", rec.Body.String(), err)
	}
	if !ar.Response.Allowed {
		return nil, fmt.Errorf("refused: %+v", ar.Response.Result)
	}
	return applyPatch(obj, ar.Response.Patch)
}

func applyPatch(obj, patch []byte) ([]byte, error) {
	if len(patch) == 0 {
		return obj, nil
	}
	p, err := jsonpatchapply.DecodePatch(patch)
	if err != nil {
		return nil, fmt.Errorf("decoding patch %s: %w", patch, err)
	}
	out, err := p.Apply(obj)
	if err != nil {
		return nil, fmt.Errorf("applying patch %s: %w", patch, err)
	}
	return out, nil
}

// checkClaimRefs: the captured pod's two elements reference claims
// vm1.blue and vm1.red, and nothing else in the pod changed.
func checkClaimRefs(patched []byte) error {
	var pod struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patched, &pod); err != nil {
		return err
	}
	elems, err := multus.Parse(pod.Metadata.Annotations[multus.NetworksAnnotation])
	if err != nil {
		return err
	}
	want := []string{"vm1.blue", "vm1.red"}
	if len(elems) != len(want) {
		return fmt.Errorf("%d selection elements, want %d", len(elems), len(want))
	}
	for i, e := range elems {
		if got := e.String(multus.KeyIPAMClaimReference); got != want[i] {
			return fmt.Errorf("element %d references %q, want %q", i, got, want[i])
		}
	}
	return nil
}

// wantSources are the networks the VM and VMI bodies gain, by what asks
// for them: two config rules and the annotation, two networks each way.
var wantSources = map[string][]string{
	"storage":             {"storage"},
	"databases-fast-path": {"fast"},
	requested.Annotation:  {"ovn", "dp"},
}

// checkNetworks: the VM or VMI has four Multus networks, each with an
// interface, and its kvnet.io/mutations says two came from the rules and
// two from the annotation.
func checkNetworks(kind string) func([]byte) error {
	return func(patched []byte) error {
		var spec kubevirtv1.VirtualMachineInstanceSpec
		var meta metav1.ObjectMeta
		if kind == "VirtualMachine" {
			var vm kubevirtv1.VirtualMachine
			if err := json.Unmarshal(patched, &vm); err != nil {
				return err
			}
			if vm.Spec.Template == nil {
				return fmt.Errorf("no template")
			}
			spec, meta = vm.Spec.Template.Spec, vm.ObjectMeta
		} else {
			var vmi kubevirtv1.VirtualMachineInstance
			if err := json.Unmarshal(patched, &vmi); err != nil {
				return err
			}
			spec, meta = vmi.Spec, vmi.ObjectMeta
		}
		var changes []chain.Change
		if err := json.Unmarshal([]byte(meta.Annotations[chain.MutationsAnnotation]), &changes); err != nil {
			return fmt.Errorf("%s: %w", chain.MutationsAnnotation, err)
		}
		got := map[string][]string{}
		for _, c := range changes {
			// Without a rule: the pod network, kept beside the Multus ones.
			if c.Mutator == "networks" && c.Rule != "" {
				got[c.Rule] = c.Networks
			}
		}
		if !reflect.DeepEqual(got, wantSources) {
			return fmt.Errorf("networks added by %v, want %v", got, wantSources)
		}
		multusNets := 0
		for _, n := range spec.Networks {
			if n.Multus != nil {
				multusNets++
			}
		}
		if multusNets != 4 || len(spec.Domain.Devices.Interfaces) != len(spec.Networks) {
			return fmt.Errorf("%d Multus networks and %d interfaces for %d networks, want 4 Multus networks with an interface each", multusNets, len(spec.Domain.Devices.Interfaces), len(spec.Networks))
		}
		return nil
	}
}

// newRequest is the POST the API server sends.
func newRequest(path string, review []byte) *http.Request {
	r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(review))
	r.Header.Set("Content-Type", "application/json")
	return r
}
