package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// vmDoc is a VM or VMI of examples/ and the outcome it is there to show.
type vmDoc struct {
	obj       *unstructured.Unstructured
	file      string
	wantValid bool
}

// readExamples reads every file of examples/ but the policy: the cluster
// objects (namespaces first, then the rest), and the VMs and VMIs in file
// order, those kvnet admits first. Files named invalid*.yaml hold VMs
// kvnet must refuse; the others, VMs it must admit. A capability that adds
// an example file is shown here without touching the demo.
func readExamples(root string) (cluster []*unstructured.Unstructured, vms []vmDoc, err error) {
	files, err := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	if err != nil {
		return nil, nil, err
	}
	var namespaces, others []*unstructured.Unstructured
	for _, f := range files {
		if filepath.Base(f) == "config.yaml" {
			continue // kvnet's policy, given with --config
		}
		objs, err := readObjects(f)
		if err != nil {
			return nil, nil, err
		}
		for _, obj := range objs {
			switch obj.GetKind() {
			case "Namespace":
				namespaces = append(namespaces, obj)
			case "VirtualMachine", "VirtualMachineInstance":
				vms = append(vms, vmDoc{obj, filepath.Base(f), !strings.HasPrefix(filepath.Base(f), "invalid")})
			default:
				others = append(others, obj)
			}
		}
	}
	// VMs kvnet admits first, then the refusals.
	slices.SortStableFunc(vms, func(a, b vmDoc) int {
		switch {
		case a.wantValid == b.wantValid:
			return 0
		case a.wantValid:
			return -1
		}
		return 1
	})
	return append(namespaces, others...), vms, nil
}

// applyCluster creates the cluster objects of examples/ and waits until
// kvnet's cache has every NAD among them.
func applyCluster(ctx context.Context, c client.Client, objs []*unstructured.Unstructured, say sayFunc) error {
	say("==> applying examples/ but its VMs: namespaces, cluster objects, NetworkAttachmentDefinitions")
	var nads []*unstructured.Unstructured
	for _, obj := range objs {
		if err := ensureNamespace(ctx, c, obj.GetNamespace()); err != nil {
			return err
		}
		if err := c.Create(ctx, obj); err != nil {
			if obj.GetKind() == "Namespace" && apierrors.IsAlreadyExists(err) {
				continue
			}
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), key(obj), err)
		}
		say("    created %s %s", obj.GetKind(), key(obj))
		if obj.GetKind() == "NetworkAttachmentDefinition" {
			nads = append(nads, obj)
		}
	}
	return waitNADsCached(ctx, c, nads)
}

// readObjects decodes every document of a YAML file.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// ensureNamespace creates ns unless it is empty or exists (the KubeVirt CR
// lives in a namespace examples/ does not declare).
func ensureNamespace(ctx context.Context, c client.Client, ns string) error {
	if ns == "" {
		return nil
	}
	err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	return nil
}

// waitNADsCached waits until kvnet's informers have every NAD: admission
// reads NADs from its cache, so a VM created a moment too early would be
// refused with "NAD not found". A server-side dry run of a VM asking for the
// NAD is the only view into another process' cache.
func waitNADsCached(ctx context.Context, c client.Client, nads []*unstructured.Unstructured) error {
	for _, nad := range nads {
		err := poll(ctx, 30*time.Second, "kvnet to see NAD "+key(nad), func() error {
			probe := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
				"metadata": map[string]any{
					"namespace": nad.GetNamespace(), "name": "kvnet-demo-probe",
					"annotations": map[string]any{"kvnet.io/networks": key(nad) + "@probe"},
				},
				"spec": map[string]any{"runStrategy": "Halted", "template": map[string]any{"spec": map[string]any{
					"domain": map[string]any{"devices": map[string]any{}, "resources": map[string]any{"requests": map[string]any{"memory": "1Gi"}}},
				}}},
			}}
			err := c.Create(ctx, probe, client.DryRunAll)
			if err != nil && strings.Contains(strings.ToLower(err.Error()), "not found") {
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
