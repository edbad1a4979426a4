// Package e2e is kvnet's real-KubeVirt tier: kube-apiserver and etcd with
// KubeVirt's generated CRDs, kvnet's manager and webhooks, and KubeVirt's own
// virt-controller and virt-api (v1.9.0) with virt-api's webhooks, all on one
// control plane. A VM is created through the API server as a user would; kvnet
// and virt-api admit it; virt-controller creates its VMI and virt-launcher
// pod; kvnet completes the pod. The tests assert on what is stored.
//
// What cannot run here (kubelet, scheduler, virt-handler) is played by the
// tests, each time with the identity of the component whose write it makes
// (see framework.KubeVirt.HandlerClient), and each such place says so.
//
// KubeVirt starts once for the package; the tests isolate themselves by
// namespace and run one after another (some change the KubeVirt CR).
package e2e

import (
	"fmt"
	"os"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/test/framework"
)

var env *framework.Env

// testConfig is the policy the tier runs with.
const testConfig = `
networkRules:
  - name: storage
    namespaceSelector:
      matchLabels: {kvnet.io/storage-network: "true"}
    networks:
      - {name: storage, nad: storage}
vdpa:
  resourcePrefixes: ["jaguarmicro.com/"]
`

// kubeVirtSpec registers the vdpa binding plugin as a vDPA deployment would
// (device-info for the sidecar, migration supported) and enables the
// feature gate virt-api requires for memLock, which kvnet sets on vDPA VMs.
// VM changes roll out live (LiveUpdate), so that adding a network to a
// running VM hot-plugs it.
func kubeVirtSpec() kubevirtv1.KubeVirtSpec {
	live := kubevirtv1.VMRolloutStrategyLiveUpdate
	return kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{
		VMRolloutStrategy:      &live,
		DeveloperConfiguration: &kubevirtv1.DeveloperConfiguration{FeatureGates: []string{memLockGate}},
		NetworkConfiguration: &kubevirtv1.NetworkConfiguration{Binding: map[string]kubevirtv1.InterfaceBindingPlugin{
			"vdpa": {
				SidecarImage: "registry.example.com/network-vdpa-binding:v1",
				DownwardAPI:  kubevirtv1.DeviceInfo,
				Migration:    &kubevirtv1.InterfaceBindingMigration{},
			},
		}},
	}}
}

func TestMain(m *testing.M) {
	var err error
	env, err = framework.Start(framework.Options{
		ConfigYAML: testConfig,
		KubeVirt:   &framework.KubeVirtOptions{Spec: kubeVirtSpec()},
		NRI:        true,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "real-KubeVirt environment:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		env.Report(os.Stderr)
	}
	env.Stop()
	os.Exit(code)
}
