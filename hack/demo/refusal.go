package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// refusals are VMs that must not run, each with who refuses it and the
// field its refusal names: one kvnet refuses (a NAD that does not exist,
// which virt-api would admit and virt-controller could never start), and one
// virt-api refuses, showing that KubeVirt's own validation is in the chain
// after kvnet's.
var refusals = []struct {
	yaml, by, field string
}{
	{by: "kvnet", field: "spec.template.spec.networks[1].multus.networkName", yaml: `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: lost-nad, namespace: tenant-a}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 1Gi}
        devices:
          interfaces: [{name: default, masquerade: {}}, {name: data, bridge: {}}]
      networks:
        - {name: default, pod: {}}
        - {name: data, multus: {networkName: no-such-nad}}
`},
	{by: "virtualmachine-validator.kubevirt.io", field: "spec.template.spec.domain.devices.interfaces[0]", yaml: `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: two-bindings, namespace: tenant-a}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        memory: {guest: 1Gi}
        devices:
          interfaces: [{name: default, masquerade: {}, binding: {name: vdpa}}]
      networks:
        - {name: default, pod: {}}
`},
}

// showRefusals creates each VM of refusals through the whole chain and
// checks who refused it, that the refusal names its field, and that
// virt-controller got nothing to start.
func showRefusals(ctx context.Context, c client.Client, w *warningCollector, out io.Writer) error {
	for _, r := range refusals {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(r.yaml), &obj.Object); err != nil {
			return fmt.Errorf("demo VM: %w", err)
		}
		name := key(&obj)
		st, err := admit(ctx, c, w, &obj, "kvnet and virt-api", out)
		if err != nil {
			return err
		}
		if st == nil {
			return fmt.Errorf("VM %s was admitted, want refused by %s", name, r.by)
		}
		if err := refusedAs(st, r.by, r.field); err != nil {
			return fmt.Errorf("VM %s: %w", name, err)
		}
		err = c.Get(ctx, client.ObjectKey{Namespace: obj.GetNamespace(), Name: obj.GetName()}, &kubevirtv1.VirtualMachineInstance{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("VM %s was refused, yet its VMI: %v", name, err)
		}
		fmt.Fprintf(out, "    refused by %s at %s; no VM stored, no VMI for virt-controller to strand\n", r.by, r.field)
	}
	return nil
}

// refusedAs checks that the webhook named by (or whose name contains) by
// refused, with a cause at field.
func refusedAs(st *metav1.Status, by, field string) error {
	if !strings.Contains(st.Message, by) {
		return fmt.Errorf("refused with %q, want a refusal by %s", st.Message, by)
	}
	if st.Details != nil {
		for _, cause := range st.Details.Causes {
			if cause.Field == field {
				return nil
			}
		}
	}
	return fmt.Errorf("refused with %q, without a cause at %s", st.Message, field)
}
