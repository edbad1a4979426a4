// Package loadtest measures kvnet's admission webhooks against the floor: a
// do-nothing controller-runtime handler fed the same AdmissionReview. It
// holds the realistic request bodies, the cluster snapshot they are
// admitted against, the servers (floor and kvnet) and the client that drives
// them (`kvnet-loadtest` (hack/loadtest, `make loadtest`)).
package loadtest

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/webhook"
)

// LauncherPodReview is the AdmissionReview a real kube-apiserver v1.37.2
// sent for a virt-launcher pod of VMI ns1/vm1 (networks blue on NAD nad1,
// red on nad2; 11 KB).
//
//go:embed testdata/launcher-pod-review.json
var LauncherPodReview []byte

// Config is the policy the fixture webhooks run with: the README's example
// rules (a storage bridge for every VM of tenant-a, an SR-IOV VF for
// databases), vDPA and kube-ovn, persistent IPs on.
const Config = `
excludedNamespaces: [kube-system, kvnet-system]
networkRules:
  - name: storage
    namespaceSelector: {matchLabels: {kvnet.io/storage-network: "true"}}
    networks: [{name: storage, nad: storage}]
  - name: databases-fast-path
    vmSelector: {matchLabels: {app.kubernetes.io/component: database}}
    namespaceSelector: {matchLabels: {kvnet.io/storage-network: "true"}}
    networks: [{name: fast, nad: tenant-a/sriov-fast, binding: auto}]
sriov: {resourcePrefixes: ["intel.com/"]}
vdpa: {resourcePrefixes: ["jaguarmicro.com/"], bindingPlugin: vdpa}
kubeOVN: {legacyLiveMigration: true}
`

// Cluster is the snapshot the fixture webhooks read: the NADs and
// namespaces of the example VM and of the captured launcher pod.
const Cluster = `
apiVersion: v1
kind: Namespace
metadata: {name: tenant-a, labels: {kvnet.io/storage-network: "true"}}
---
apiVersion: v1
kind: Namespace
metadata: {name: dpu}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns1}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: storage, namespace: tenant-a}
spec: {config: '{"cniVersion":"0.4.0","name":"storage","type":"bridge","bridge":"br-storage"}'}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: sriov-fast, namespace: tenant-a, annotations: {k8s.v1.cni.cncf.io/resourceName: intel.com/sriov_netdevice}}
spec: {config: '{"cniVersion":"0.4.0","name":"sriov-fast","type":"sriov","vlan":100}'}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: vdpa-net, namespace: dpu, annotations: {k8s.v1.cni.cncf.io/resourceName: jaguarmicro.com/jaguar}}
spec: {config: '{"cniVersion":"0.3.1","name":"vdpa-net","type":"sriov","vlan":0}'}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: ovn-attach, namespace: tenant-a}
spec: {config: '{"cniVersion":"0.3.0","type":"kube-ovn","server_socket":"/run/openvswitch/kube-ovn-daemon.sock","provider":"ovn-attach.tenant-a.ovn"}'}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: nad1, namespace: ns1}
spec: {config: '{"cniVersion":"0.4.0","name":"l2-blue","type":"ovn-k8s-cni-overlay","topology":"layer2","netAttachDefName":"ns1/nad1","allowPersistentIPs":true}'}
---
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: nad2, namespace: ns1}
spec: {config: '{"cniVersion":"0.4.0","name":"l2-red","type":"ovn-k8s-cni-overlay","topology":"layer2","netAttachDefName":"ns1/nad2","allowPersistentIPs":true}'}
`

// Fixture is everything the kvnet webhooks need to admit the bodies
// without a cluster.
type Fixture struct {
	Config *config.Config
	Facts  *lookup.Snapshot
	// Cache answers the launcher-pod mutator's VMI and IPAMClaim reads.
	Cache client.Reader
}

// NewFixture parses Config and Cluster.
func NewFixture() (*Fixture, error) {
	cfg, err := config.Parse([]byte(Config), "kvnet-system")
	if err != nil {
		return nil, fmt.Errorf("fixture config: %w", err)
	}
	docs, err := offline.ReadFiles([]string{"-"}, bytes.NewReader([]byte(Cluster)))
	if err != nil {
		return nil, err
	}
	facts, err := offline.Facts(docs)
	if err != nil {
		return nil, err
	}
	return &Fixture{Config: cfg, Facts: facts, Cache: objects{client.ObjectKey{Namespace: "ns1", Name: "vm1"}: LauncherVMI()}}, nil
}

// Handlers are kvnet's handlers on the fixture, as `kvnet webhook` builds
// them with persistent IPs on.
func (f *Fixture) Handlers() webhook.Handlers {
	hs := webhook.NewHandlers(config.Static(f.Config), f.Facts, app.Chains(app.Capabilities{
		PersistentIPs: app.PersistentIPSteps{ClaimRefs: mutators.ClaimRefs{Cache: f.Cache}},
		// Config has no migration section, so the mutator returns before
		// it would reserve an address: it needs no allocator here (see
		// VirtHandlerPod).
		Migration: app.MigrationSteps{Addresses: &migration.AddressMutator{}},
	}))
	// `kvnet proxy` serves the migration-status rewrite (see statusRewriter).
	hs[webhook.PathMutateVMIMigrationStatus] = f.statusRewriter()
	return hs
}

// LauncherVMI is the VMI the captured launcher pod runs: VM vm1's, with
// networks blue (ns1/nad1) and red (ns1/nad2) next to the pod network.
func LauncherVMI() *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns1", Name: "vm1", UID: "747cfc6c-3371-48b4-a25d-5d0f36fd8c51",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: "vm1", UID: "0b1a9d8c-6f0e-4f43-9f0c-1f2d3c4b5a69", Controller: ptr.To(true)}},
	}}
	vmi.Spec.Networks = []kubevirtv1.Network{
		{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}},
		{Name: "blue", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "nad1"}}},
		{Name: "red", NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: "nad2"}}},
	}
	return vmi
}

// objects is the informer cache's read path for the fixture: a map lookup
// and a deep copy per Get, as controller-runtime's cache reader does.
type objects map[client.ObjectKey]*kubevirtv1.VirtualMachineInstance

func (o objects) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	dst, ok := obj.(*kubevirtv1.VirtualMachineInstance)
	src := o[key]
	if !ok || src == nil {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	src.DeepCopyInto(dst)
	return nil
}

func (o objects) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return nil
}
