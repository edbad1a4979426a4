package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/test/framework"
)

// kubeVirtMissing says why KubeVirt's own components cannot run (nil when
// both binaries of `make kubevirt` are there).
func kubeVirtMissing() error {
	for _, b := range []string{"virt-controller", "virt-api"} {
		p := filepath.Join(framework.KubeVirtBinDir(), b)
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("KubeVirt's %s %s is not in %s", b, framework.KubeVirtVersion, framework.KubeVirtBinDir())
		}
	}
	return nil
}

// whatKubeVirtShows is what the demo leaves out without KubeVirt's binaries.
const whatKubeVirtShows = `a VM becoming a VMI and a virt-launcher pod rendered by the real virt-controller,
    the pod's ipam-claim-reference and the VM's IPAMClaims, a virt-handler pod's migration0
    address, the same claim after a stop and start, and a refusal with virt-api in the chain`

// startKubeVirt runs KubeVirt's own virt-controller and virt-api as
// test/framework does for the real-KubeVirt tier: the objects virt-operator
// would create (namespace kubevirt, service accounts, the KubeVirt CR of
// examples/ with the status both binaries wait for), each component under
// its own service-account token, and virt-api's 27 webhooks registered by
// URL. The caller stops it.
func startKubeVirt(ctx context.Context, te *envtest.Environment, c client.Client, dir string, cr *unstructured.Unstructured, say sayFunc) (*framework.KubeVirt, error) {
	var spec kubevirtv1.KubeVirtSpec
	if cr != nil {
		b, err := json.Marshal(cr.Object["spec"])
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			return nil, fmt.Errorf("examples/ KubeVirt CR: %w", err)
		}
	}
	say("==> starting KubeVirt %s's virt-controller and virt-api from %s; logs: %s", framework.KubeVirtVersion, framework.KubeVirtBinDir(), filepath.Join(dir, "logs"))
	kv, err := framework.StartKubeVirt(ctx, te.Config, c, dir, framework.KubeVirtOptions{Spec: spec})
	if err != nil {
		return nil, fmt.Errorf("starting KubeVirt (logs in %s): %w", filepath.Join(dir, "logs"), err)
	}
	say("    virt-controller is leader, virt-api is healthy and its webhooks refuse a probe VM;")
	say("    the KubeVirt CR is examples/kubevirt.yaml's, with the status virt-operator would write")
	return kv, nil
}
