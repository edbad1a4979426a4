package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/store"
)

// The source side of a decentralized migration of VMI tenant-a/bench: the
// remote target reported 10.20.0.9 with two ports, and the proxy published
// relays on 192.168.7.2 for them.
const (
	migrationUID  = "5d2a7c1e-0b6f-4a53-9a0e-4c3b2a1f0e9d"
	migrationID   = "bench-migration"
	remoteAddress = "10.20.0.9"
	proxyAddress  = "192.168.7.2"
	mappingsNS    = "kvnet-system"
)

var (
	remotePorts = map[string]int{"40001": 0, "40002": 49152}
	proxyPorts  = map[string]int{"31001": 0, "31002": 49152}
	// mapping is what the proxy publishes, in the store and on the VMI.
	mapping = store.Mapping{MigrationID: migrationID, Address: proxyAddress, Target: remoteAddress,
		Ports: map[string]string{"40001": "31001", "40002": "31002"}}.Encode()
)

// SourceVMIM is the in-flight migration that makes tenant-a/bench the source
// of a decentralized migration.
func SourceVMIM() *kubevirtv1.VirtualMachineInstanceMigration {
	return &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "bench-out", UID: migrationUID},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "bench",
			SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: migrationID, ConnectURL: "sync.cluster-b.example:9185"}},
		Status: kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: kubevirtv1.MigrationRunning},
	}
}

// migrationStatusReview is the UPDATE virt-handler's synchronization
// controller sends for the source VMI (the fixture VMI, running, with its
// migrationState): the top-level target fields carry the remote values
// copied from targetState, which kvnet must point at the proxy's relays.
func migrationStatusReview(vmi []byte) ([]byte, error) {
	var obj map[string]any
	if err := json.Unmarshal(vmi, &obj); err != nil {
		return nil, err
	}
	md := obj["metadata"].(map[string]any)
	md["uid"] = "8e3f0a4c-2b1d-4c6e-9f7a-0d1c2b3a4e5f"
	md["resourceVersion"] = "48121"
	ann, _ := md["annotations"].(map[string]any)
	if ann == nil {
		ann = map[string]any{}
	}
	ann[store.AnnotationMapping] = mapping
	md["annotations"] = ann
	ms := kubevirtv1.VirtualMachineInstanceMigrationState{
		MigrationUID: migrationUID, TargetNode: "remote-node-3", SourceNode: "node-1", Mode: kubevirtv1.MigrationPreCopy,
		TargetNodeAddress: remoteAddress, TargetDirectMigrationNodePorts: maps.Clone(remotePorts),
		TargetState: &kubevirtv1.VirtualMachineInstanceMigrationTargetState{
			VirtualMachineInstanceCommonMigrationState: kubevirtv1.VirtualMachineInstanceCommonMigrationState{Node: "remote-node-3", MigrationUID: "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"},
			NodeAddress: ptr.To(remoteAddress), DirectMigrationNodePorts: maps.Clone(remotePorts),
		},
	}
	obj["status"] = map[string]any{"phase": "Running", "nodeName": "node-1", "migrationState": ms,
		"interfaces": []map[string]any{{"name": "default", "ipAddress": "10.244.1.17", "mac": "02:42:ac:11:00:02"}}}
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	ar := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:      "00000000-0000-0000-0000-000000000001",
			Kind:     metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: "VirtualMachineInstance"},
			Resource: metav1.GroupVersionResource{Group: "kubevirt.io", Version: "v1", Resource: "virtualmachineinstances"},
			Name:     "bench", Namespace: "tenant-a", Operation: admissionv1.Update,
			UserInfo:  authenticationUser(),
			Object:    runtime.RawExtension{Raw: raw},
			OldObject: runtime.RawExtension{Raw: raw},
		},
	}
	return json.Marshal(ar)
}

// checkMigrationStatus: the two top-level fields point at the proxy's
// relays, and targetState still holds the truthful remote endpoint.
func checkMigrationStatus(patched []byte) error {
	var vmi kubevirtv1.VirtualMachineInstance
	if err := json.Unmarshal(patched, &vmi); err != nil {
		return err
	}
	ms := vmi.Status.MigrationState
	if ms == nil || ms.TargetState == nil || ms.TargetState.NodeAddress == nil {
		return fmt.Errorf("migrationState or its targetState lost")
	}
	if ms.TargetNodeAddress != proxyAddress || !maps.Equal(ms.TargetDirectMigrationNodePorts, proxyPorts) {
		return fmt.Errorf("targetNodeAddress %q ports %v, want %q %v", ms.TargetNodeAddress, ms.TargetDirectMigrationNodePorts, proxyAddress, proxyPorts)
	}
	if *ms.TargetState.NodeAddress != remoteAddress || !maps.Equal(ms.TargetState.DirectMigrationNodePorts, remotePorts) {
		return fmt.Errorf("targetState changed: %q %v", *ms.TargetState.NodeAddress, ms.TargetState.DirectMigrationNodePorts)
	}
	return nil
}

// statusRewriter is the migration-status handler as `kvnet proxy` builds
// it, reading the fixture's migrations and published mappings where kvnet
// reads its informer caches. APIReader stays nil: the VMIM is in the cache,
// so the real handler never asks the API either.
func (f *Fixture) statusRewriter() *proxy.StatusRewriter {
	c := proxyCache{vmims: []*kubevirtv1.VirtualMachineInstanceMigration{SourceVMIM()},
		mappings: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: mappingsNS, Name: store.DefaultMappingsName},
			Data: map[string]string{"tenant-a.bench": mapping}}}
	return &proxy.StatusRewriter{Reader: c, Store: store.MappingStore{Namespace: mappingsNS}, MappingsReader: c}
}

// proxyCache is the informer caches' read path for the rewriter: a deep
// copy per object read, as controller-runtime's cache reader does.
type proxyCache struct {
	vmims    []*kubevirtv1.VirtualMachineInstanceMigration
	mappings *corev1.ConfigMap
}

func (c proxyCache) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || key != client.ObjectKeyFromObject(c.mappings) {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
	}
	c.mappings.DeepCopyInto(cm)
	return nil
}

func (c proxyCache) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	l, ok := list.(*kubevirtv1.VirtualMachineInstanceMigrationList)
	if !ok {
		return fmt.Errorf("proxyCache lists only VirtualMachineInstanceMigrations, not %T", list)
	}
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	l.Items = l.Items[:0]
	for _, m := range c.vmims {
		if lo.Namespace == "" || lo.Namespace == m.Namespace {
			l.Items = append(l.Items, *m.DeepCopy())
		}
	}
	return nil
}

// VirtHandlerPod is a virt-handler pod as the DaemonSet controller creates
// it (pinned to its node by node affinity), which the migration-pods webhook
// admits. The fixture policy configures no migration network, so kvnet
// decodes the pod's metadata and placement, runs the migration mutator,
// which finds nothing to reserve, and answers with no patch: this body
// measures that path, not an address reservation (which writes an
// allocation object to the API server, so its cost is the API's).
const VirtHandlerPod = `
apiVersion: v1
kind: Pod
metadata:
  generateName: virt-handler-
  namespace: kubevirt
  labels:
    kubevirt.io: virt-handler
    prometheus.kubevirt.io: "true"
    controller-revision-hash: 7c9b6d5f8
    pod-template-generation: "1"
  annotations:
    kubevirt.io/install-strategy-identifier: 2b6e4c0f9a
    kubevirt.io/install-strategy-registry: quay.io/kubevirt
    kubevirt.io/install-strategy-version: v1.9.0
  ownerReferences:
    - {apiVersion: apps/v1, kind: DaemonSet, name: virt-handler, uid: 1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9, controller: true, blockOwnerDeletion: true}
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchFields: [{key: metadata.name, operator: In, values: [node-1]}]
  serviceAccountName: kubevirt-handler
  hostPID: true
  priorityClassName: kubevirt-cluster-critical
  tolerations:
    - {key: CriticalAddonsOnly, operator: Exists}
    - {key: node.kubernetes.io/unschedulable, operator: Exists, effect: NoSchedule}
  initContainers:
    - name: virt-launcher
      image: quay.io/kubevirt/virt-launcher:v1.9.0
      command: [/bin/sh, -c]
      args: [node-labeller.sh]
      securityContext: {privileged: true}
      volumeMounts: [{name: node-labeller, mountPath: /var/lib/kubevirt-node-labeller}]
  containers:
    - name: virt-handler
      image: quay.io/kubevirt/virt-handler:v1.9.0
      command: [virt-handler, --port, "8443", --hostname-override, $(NODE_NAME), --pod-ip-address, $(MY_POD_IP), --max-metric-requests, "3", --console-server-port, "8186", --graceful-shutdown-seconds, "315", -v, "2"]
      env:
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
        - name: MY_POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
      ports: [{name: metrics, containerPort: 8443, protocol: TCP}]
      resources: {requests: {cpu: 10m, memory: 325Mi}}
      securityContext: {privileged: true, seLinuxOptions: {level: s0}}
      volumeMounts:
        - {name: libvirt-runtimes, mountPath: /var/run/kubevirt-libvirt-runtimes}
        - {name: virt-share-dir, mountPath: /var/run/kubevirt, mountPropagation: Bidirectional}
        - {name: virt-private-dir, mountPath: /var/run/kubevirt-private}
        - {name: kubelet-pods, mountPath: /pods, mountPropagation: HostToContainer}
        - {name: device-plugin, mountPath: /var/lib/kubelet/device-plugins}
  volumes:
    - {name: libvirt-runtimes, hostPath: {path: /var/run/kubevirt-libvirt-runtimes}}
    - {name: virt-share-dir, hostPath: {path: /var/run/kubevirt}}
    - {name: virt-private-dir, hostPath: {path: /var/run/kubevirt-private}}
    - {name: kubelet-pods, hostPath: {path: /var/lib/kubelet/pods}}
    - {name: device-plugin, hostPath: {path: /var/lib/kubelet/device-plugins}}
    - {name: node-labeller, emptyDir: {}}
`
