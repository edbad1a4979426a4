package main

import (
	"context"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/test/framework"
)

// showMission runs the steps that need KubeVirt's own components, each
// checked: the first error ends the demo with a non-zero exit.
func showMission(ctx context.Context, c client.Client, w *warningCollector, root string, out io.Writer, say sayFunc) error {
	say("\n==> 1. VM %s/%s becomes a VMI and a virt-launcher pod (virt-controller %s); its IP persists (IPAMClaim)", persistentNS, persistentVM, framework.KubeVirtVersion)
	first, err := showLaunch(ctx, c, "", say)
	if err != nil {
		return fmt.Errorf("step 1: %w", err)
	}
	say("\n==> 2. a virt-handler pod gets its migration0 address from kvnet's pool")
	if err := showHandler(ctx, c, root, say); err != nil {
		return fmt.Errorf("step 2: %w", err)
	}
	say("\n==> 3. VM %s/%s is stopped and started: a new VMI and pod, the same claim", persistentNS, persistentVM)
	if err := showRestart(ctx, c, first, say); err != nil {
		return fmt.Errorf("step 3: %w", err)
	}
	say("\n==> 4. VMs that must not run are refused, each with its field path")
	if err := showRefusals(ctx, c, w, out); err != nil {
		return fmt.Errorf("step 4: %w", err)
	}
	say("\n==> done: KubeVirt's own virt-controller and virt-api did each step above with kvnet")
	return nil
}

// takeKubeVirtCR removes the KubeVirt CR from the cluster objects and
// returns it (nil when examples/ has none).
func takeKubeVirtCR(objs []*unstructured.Unstructured) (rest []*unstructured.Unstructured, cr *unstructured.Unstructured) {
	for _, o := range objs {
		if o.GetKind() == "KubeVirt" && cr == nil {
			cr = o
			continue
		}
		rest = append(rest, o)
	}
	return rest, cr
}
