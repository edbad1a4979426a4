package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

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
