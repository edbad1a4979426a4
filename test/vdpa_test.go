package test

import (
	"fmt"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"
)

const vdpaNADConfig = `{"cniVersion":"0.3.1","name":"vdpa-net","type":"sriov"}`

const vdpaVM = `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: dpdk
  annotations: {kvnet.io/networks: "vdpa-net@dataplane"}
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        cpu: {cores: 4}
        devices: {}
        resources: {requests: {memory: 2Gi}}
`

// A vDPA attachment becomes the plugin binding with locked memory and
// multiqueue; the client is warned the VM cannot live-migrate.
func TestVDPAAttachmentSpecAndWarning(t *testing.T) {
	setKubeVirt(t, vdpaKubeVirt(false))
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "vdpa-net", "jaguarmicro.com/jaguar", vdpaNADConfig)
	c, warnings := warningClient(t)
	if _, err := createVM(t, c, ns, vdpaVM); err != nil {
		t.Fatal(err)
	}
	spec := getVM(t, ns, "dpdk").Spec.Template.Spec
	ifaces := spec.Domain.Devices.Interfaces
	// The VM declared no network, so KubeVirt would have attached the pod
	// network by itself: kvnet writes it out before adding dataplane.
	if len(ifaces) != 2 || ifaces[0].Name != "default" || ifaces[1].Binding == nil || ifaces[1].Binding.Name != "vdpa" {
		t.Fatalf("interfaces = %+v, want default + dataplane bound by plugin vdpa", ifaces)
	}
	if m := spec.Domain.Memory; m == nil || m.ReservedOverhead == nil || m.ReservedOverhead.MemLock == nil || *m.ReservedOverhead.MemLock != kubevirtv1.MemLockRequired {
		t.Fatalf("memory = %+v, want reservedOverhead.memLock Required", spec.Domain.Memory)
	}
	if q := spec.Domain.Devices.NetworkInterfaceMultiQueue; q == nil || !*q {
		t.Fatalf("networkInterfaceMultiqueue = %v, want true", q)
	}
	found := false
	for _, w := range warnings.all() {
		if strings.Contains(w, "cannot be live-migrated") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no live-migration warning among %q", warnings.all())
	}

	// Once the plugin declares a migration method, the warning goes away.
	setKubeVirt(t, vdpaKubeVirt(true))
	c2, warnings2 := warningClient(t)
	if _, err := createVM(t, c2, ns, strings.Replace(vdpaVM, "name: dpdk", "name: dpdk2", 1)); err != nil {
		t.Fatal(err)
	}
	for _, w := range warnings2.all() {
		if strings.Contains(w, "live-migrated") {
			t.Fatalf("unexpected warning with a migratable plugin: %s", w)
		}
	}
}

// What cannot work is refused with the field that is wrong.
func TestVDPARefusals(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "vdpa-net", "jaguarmicro.com/jaguar", vdpaNADConfig)

	t.Run("plugin missing from the KubeVirt CR", func(t *testing.T) {
		setKubeVirt(t, kubevirtv1.KubeVirtSpec{})
		defer setKubeVirt(t, vdpaKubeVirt(false))
		_, err := createVM(t, env.Client, ns, strings.Replace(vdpaVM, "name: dpdk", "name: noplugin", 1))
		hasCause(t, err, "spec.template.spec.domain.devices.interfaces[1].binding.name", "declares no network binding plugin")
	})
	t.Run("plugin without device-info", func(t *testing.T) {
		spec := vdpaKubeVirt(false)
		p := spec.Configuration.NetworkConfiguration.Binding["vdpa"]
		p.DownwardAPI = ""
		spec.Configuration.NetworkConfiguration.Binding["vdpa"] = p
		setKubeVirt(t, spec)
		defer setKubeVirt(t, vdpaKubeVirt(false))
		_, err := createVM(t, env.Client, ns, strings.Replace(vdpaVM, "name: dpdk", "name: nodeviceinfo", 1))
		hasCause(t, err, "spec.template.spec.domain.devices.interfaces[1].binding.name", "device-info")
	})
	t.Run("memLock NotRequired", func(t *testing.T) {
		setKubeVirt(t, vdpaKubeVirt(true))
		vm := strings.Replace(vdpaVM, "name: dpdk", "name: nolock", 1)
		vm = strings.Replace(vm, "cpu: {cores: 4}", "cpu: {cores: 4}\n        memory: {reservedOverhead: {memLock: NotRequired}}", 1)
		_, err := createVM(t, env.Client, ns, vm)
		hasCause(t, err, "spec.template.spec.domain.memory.reservedOverhead.memLock", "Unsupported value")
	})
	t.Run("bridge on a vDPA NAD", func(t *testing.T) {
		setKubeVirt(t, vdpaKubeVirt(true))
		_, err := createVM(t, env.Client, ns, fmt.Sprintf(`
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: bridged}
spec:
  template:
    spec:
      domain:
        devices:
          interfaces: [{name: dp, bridge: {}}]
        resources: {requests: {memory: 1Gi}}
      networks: [{name: dp, multus: {networkName: %s/vdpa-net}}]
`, ns))
		hasCause(t, err, "spec.template.spec.domain.devices.interfaces[0]", "is a vDPA network")
	})
}
