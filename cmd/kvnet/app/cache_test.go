package app

import (
	"reflect"
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// fullMeta is what every trim must keep (labels, annotations kvnet reads, owner
// references, UID, resourceVersion, deletion) and what it must drop.
func fullMeta() metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: "ns1", Name: "vm1", UID: "u1", ResourceVersion: "7",
		Labels:          map[string]string{"app": "db"},
		Annotations:     map[string]string{kubevirtv1.DomainAnnotation: "vm1", lastApplied: `{"big":"copy"}`},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "vm1", UID: "u0", Controller: ptr.To(true)}},
		Finalizers:      []string{"f"},
		ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
	}
}

func trimmedMeta() metav1.ObjectMeta {
	m := fullMeta()
	m.ManagedFields = nil
	delete(m.Annotations, lastApplied)
	return m
}

func networks() []kubevirtv1.Network {
	return []kubevirtv1.Network{
		{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
		{Name: "blue", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "nad1"}}},
	}
}

func interfaces() []kubevirtv1.Interface {
	return []kubevirtv1.Interface{{Name: "default", MacAddress: "02:00:00:00:10:01"}, {Name: "blue"}}
}

func vmiSpec() kubevirtv1.VirtualMachineInstanceSpec {
	return kubevirtv1.VirtualMachineInstanceSpec{
		Networks: networks(),
		Domain: kubevirtv1.DomainSpec{
			CPU: &kubevirtv1.CPU{Cores: 2},
			Devices: kubevirtv1.Devices{
				Interfaces:             interfaces(),
				AutoattachPodInterface: ptr.To(false),
				Disks:                  []kubevirtv1.Disk{{Name: "root"}},
			}},
		Volumes: []kubevirtv1.Volume{{Name: "root"}},
	}
}

// trimmedSpec is vmiSpec as the cache keeps it.
func trimmedSpec() kubevirtv1.VirtualMachineInstanceSpec {
	var s kubevirtv1.VirtualMachineInstanceSpec
	s.Networks = networks()
	s.Domain.Devices.Interfaces = interfaces()
	s.Domain.Devices.AutoattachPodInterface = ptr.To(false)
	return s
}

func podCreate() []admissionregv1.RuleWithOperations {
	return []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Create},
		Rule: admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}
}

var sel = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}

// TestCacheTrims: each cached kind keeps exactly what kvnet reads of it
// (see cacheOptions) and loses managedFields and kubectl's last-applied copy.
func TestCacheTrims(t *testing.T) {
	opts := cacheOptions()
	transform := func(obj client.Object) toolscache.TransformFunc {
		for k, bo := range opts.ByObject {
			if reflect.TypeOf(k) == reflect.TypeOf(obj) {
				return bo.Transform
			}
		}
		return opts.DefaultTransform
	}
	nadSpec := nadv1.NetworkAttachmentDefinitionSpec{Config: `{"cniVersion":"0.4.0","type":"bridge"}`}
	for _, c := range []struct {
		name     string
		in, want client.Object
	}{{
		name: "VMI keeps metadata, networks and interfaces",
		in: &kubevirtv1.VirtualMachineInstance{ObjectMeta: fullMeta(), Spec: vmiSpec(),
			Status: kubevirtv1.VirtualMachineInstanceStatus{Phase: kubevirtv1.Running, NodeName: "n1"}},
		want: &kubevirtv1.VirtualMachineInstance{ObjectMeta: trimmedMeta(), Spec: trimmedSpec()},
	}, {
		name: "VM keeps metadata and the template's networks and interfaces",
		in: &kubevirtv1.VirtualMachine{ObjectMeta: fullMeta(), Spec: kubevirtv1.VirtualMachineSpec{
			RunStrategy: ptr.To(kubevirtv1.RunStrategyAlways),
			Template:    &kubevirtv1.VirtualMachineInstanceTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "b"}}, Spec: vmiSpec()},
		}, Status: kubevirtv1.VirtualMachineStatus{Ready: true}},
		want: &kubevirtv1.VirtualMachine{ObjectMeta: trimmedMeta(), Spec: kubevirtv1.VirtualMachineSpec{
			Template: &kubevirtv1.VirtualMachineInstanceTemplateSpec{Spec: trimmedSpec()},
		}},
	}, {
		name: "VM without a template stays without one",
		in:   &kubevirtv1.VirtualMachine{ObjectMeta: fullMeta()},
		want: &kubevirtv1.VirtualMachine{ObjectMeta: trimmedMeta()},
	}, {
		name: "namespace metadata loses managedFields",
		in:   &metav1.PartialObjectMetadata{ObjectMeta: fullMeta()},
		want: &metav1.PartialObjectMetadata{ObjectMeta: trimmedMeta()},
	}, {
		name: "NAD keeps its config",
		in:   &nadv1.NetworkAttachmentDefinition{ObjectMeta: fullMeta(), Spec: nadSpec},
		want: &nadv1.NetworkAttachmentDefinition{ObjectMeta: trimmedMeta(), Spec: nadSpec},
	}, {
		name: "MutatingWebhookConfiguration keeps each webhook's name, rules, selectors and reinvocation policy",
		in: &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: fullMeta(), Webhooks: []admissionregv1.MutatingWebhook{{
			Name: "w", Rules: podCreate(), NamespaceSelector: sel, ObjectSelector: sel,
			ReinvocationPolicy: ptr.To(admissionregv1.IfNeededReinvocationPolicy),
			ClientConfig:       admissionregv1.WebhookClientConfig{URL: ptr.To("https://x/mutate"), CABundle: []byte("ca")},
			FailurePolicy:      ptr.To(admissionregv1.Fail), SideEffects: ptr.To(admissionregv1.SideEffectClassNone),
		}}},
		want: &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: trimmedMeta(), Webhooks: []admissionregv1.MutatingWebhook{{
			Name: "w", Rules: podCreate(), NamespaceSelector: sel, ObjectSelector: sel,
			ReinvocationPolicy: ptr.To(admissionregv1.IfNeededReinvocationPolicy),
		}}},
	}, {
		name: "KubeVirt CR keeps spec and status",
		in: &kubevirtv1.KubeVirt{ObjectMeta: fullMeta(), Spec: kubevirtv1.KubeVirtSpec{ImageTag: "v1.9.0"},
			Status: kubevirtv1.KubeVirtStatus{Phase: kubevirtv1.KubeVirtPhaseDeployed}},
		want: &kubevirtv1.KubeVirt{ObjectMeta: trimmedMeta(), Spec: kubevirtv1.KubeVirtSpec{ImageTag: "v1.9.0"},
			Status: kubevirtv1.KubeVirtStatus{Phase: kubevirtv1.KubeVirtPhaseDeployed}},
	}} {
		t.Run(c.name, func(t *testing.T) {
			out, err := transform(c.in)(c.in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out, c.want) {
				t.Errorf("trimmed to\n%+v\nwant\n%+v", out, c.want)
			}
		})
	}
	// A tombstone is not an object: every transform passes it through.
	tomb := toolscache.DeletedFinalStateUnknown{Key: "ns1/vm1"}
	for _, f := range []toolscache.TransformFunc{opts.DefaultTransform, trimVMI, trimVM} {
		if out, err := f(tomb); err != nil || out != tomb {
			t.Errorf("tombstone: got %v, %v", out, err)
		}
	}
}
