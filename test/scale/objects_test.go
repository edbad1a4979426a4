package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/test/loadtest"
)

// size is the cluster a run loads: Namespaces namespaces, each with
// NADsPerNamespace NADs and VMsPerNamespace VMIs, each VMI with its
// virt-launcher pod.
type size struct {
	Namespaces, NADsPerNamespace, VMsPerNamespace int
}

func (s size) NADs() int { return s.Namespaces * s.NADsPerNamespace }
func (s size) VMIs() int { return s.Namespaces * s.VMsPerNamespace }

func (s size) String() string {
	return fmt.Sprintf("%d namespaces, %d NADs, %d VMIs, %d virt-launcher pods", s.Namespaces, s.NADs(), s.VMIs(), s.VMIs())
}

// cluster is a bare control plane (no webhooks registered: the load is
// created directly) with the CRDs of the kinds kvnet reads.
type cluster struct {
	env    *envtest.Environment
	config *rest.Config
	// client has no client-side rate limit: the loader's throughput is the
	// API server's, not client-go's default 5 requests per second.
	client client.Client
}

// kvnetCRDs are the CRDs of the kinds kvnet reads: the VM, VMI, migration
// and KubeVirt CRs of KubeVirt's own set (not its pools, snapshots,
// instance types..., which only slow the control plane's start), NADs and
// IPAMClaims.
var kvnetCRDs = []string{"kubevirts.kubevirt.io", "virtualmachines.kubevirt.io", "virtualmachineinstances.kubevirt.io", "virtualmachineinstancemigrations.kubevirt.io"}

func startCluster() (*cluster, error) {
	assets, err := framework.AssetsDir()
	if err != nil {
		return nil, err
	}
	all, err := framework.CRDPaths()
	if err != nil {
		return nil, err
	}
	var crds []string
	for _, p := range all {
		if p != framework.KubeVirtCRDDir() {
			crds = append(crds, p)
		}
	}
	for _, name := range kvnetCRDs {
		crds = append(crds, filepath.Join(framework.KubeVirtCRDDir(), name+".json"))
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: true, Scheme: app.Scheme()}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting a control plane: %w", err)
	}
	c := &cluster{env: env, config: cfg}
	unlimited := rest.CopyConfig(cfg)
	unlimited.QPS, unlimited.Burst = -1, 0
	if c.client, err = client.New(unlimited, client.Options{Scheme: app.Scheme()}); err == nil {
		err = c.client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: framework.KvnetNamespace}})
	}
	if err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func (c *cluster) stop() { _ = c.env.Stop() }

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// seed creates what the loadtest bodies are admitted against, in both
// clusters: the fixture's namespaces and NADs, and VMI ns1/vm1 whose
// virt-launcher pod the captured review is.
func seed(ctx context.Context, c client.Client) error {
	for _, doc := range strings.Split(loadtest.Cluster, "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return fmt.Errorf("fixture object: %w", err)
		}
		if err := c.Create(ctx, u); err != nil {
			return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	want := loadtest.LauncherVMI()
	vmi := newVMI(want.Namespace, want.Name, want.OwnerReferences[0].UID, want.Spec.Networks)
	if err := c.Create(ctx, vmi); err != nil {
		return fmt.Errorf("creating VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return nil
}

// load creates s's objects with workers concurrent creates: namespaces,
// then NADs, then each VMI followed by its launcher pod (which carries the
// VMI's UID).
func load(ctx context.Context, c client.Client, s size, workers int) error {
	tmpl, err := launcherPodTemplate()
	if err != nil {
		return err
	}
	if err := parallel(ctx, s.Namespaces, workers, func(ctx context.Context, i int) error {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i), Labels: map[string]string{"team": fmt.Sprintf("team-%d", i%50)}}}
		if i%2 == 0 {
			ns.Labels["kvnet.io/storage-network"] = "true"
		}
		return c.Create(ctx, ns)
	}); err != nil {
		return fmt.Errorf("creating namespaces: %w", err)
	}
	if err := parallel(ctx, s.NADs(), workers, func(ctx context.Context, i int) error {
		return c.Create(ctx, newNAD(nsName(i/s.NADsPerNamespace), i%s.NADsPerNamespace))
	}); err != nil {
		return fmt.Errorf("creating NADs: %w", err)
	}
	if err := parallel(ctx, s.VMIs(), workers, func(ctx context.Context, i int) error {
		ns, name := nsName(i/s.VMsPerNamespace), fmt.Sprintf("vm-%d", i%s.VMsPerNamespace)
		nets := []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
		for j := 0; j < 2 && j < s.NADsPerNamespace; j++ {
			nad := (i + j) % s.NADsPerNamespace
			nets = append(nets, kubevirtv1.Network{Name: fmt.Sprintf("net%d", nad), NetworkSource: kubevirtv1.NetworkSource{Multus: &kubevirtv1.MultusNetwork{NetworkName: nadName(nad)}}})
		}
		vmi := newVMI(ns, name, types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i)), nets)
		if err := c.Create(ctx, vmi); err != nil {
			return err
		}
		pod, err := launcherPod(tmpl, vmi)
		if err != nil {
			return err
		}
		return c.Create(ctx, pod)
	}); err != nil {
		return fmt.Errorf("creating VMIs and launcher pods: %w", err)
	}
	return nil
}

func nsName(i int) string   { return fmt.Sprintf("scale-%04d", i) }
func nadName(i int) string  { return fmt.Sprintf("net-%d", i) }
func vmLabel(i int) string  { return []string{"web", "database", "cache", "batch"}[i%4] }
func bridgeOf(i int) string { return fmt.Sprintf("br-%d", i) }

// newNAD is one of the kinds of NAD a cluster has: a Linux bridge, an
// OVN-Kubernetes layer-2 overlay that allows persistent IPs, an SR-IOV VF
// (with its device-plugin resource) and a kube-ovn attachment.
func newNAD(ns string, i int) *nadv1.NetworkAttachmentDefinition {
	nad := &nadv1.NetworkAttachmentDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: nadName(i)}}
	switch i % 4 {
	case 0:
		nad.Spec.Config = fmt.Sprintf(`{"cniVersion":"0.4.0","name":"%s","type":"bridge","bridge":"%s","vlan":%d,"ipam":{"type":"whereabouts","range":"10.%d.%d.0/24"}}`, nad.Name, bridgeOf(i), 100+i, i, len(ns)%200)
	case 1:
		nad.Spec.Config = fmt.Sprintf(`{"cniVersion":"0.4.0","name":"l2-%s-%s","type":"ovn-k8s-cni-overlay","topology":"layer2","netAttachDefName":"%s/%s","subnets":"10.200.%d.0/24","allowPersistentIPs":true}`, ns, nad.Name, ns, nad.Name, i)
	case 2:
		nad.Annotations = map[string]string{"k8s.v1.cni.cncf.io/resourceName": "intel.com/sriov_netdevice"}
		nad.Spec.Config = fmt.Sprintf(`{"cniVersion":"0.4.0","name":"%s","type":"sriov","vlan":%d,"spoofchk":"on","ipam":{"type":"host-local","subnet":"10.56.%d.0/24"}}`, nad.Name, 200+i, i)
	default:
		nad.Spec.Config = fmt.Sprintf(`{"cniVersion":"0.3.0","type":"kube-ovn","server_socket":"/run/openvswitch/kube-ovn-daemon.sock","provider":"%s.%s.ovn"}`, nad.Name, ns)
	}
	return nad
}

// newVMI is a VMI as virt-controller leaves it after a VM started it: owned
// by its VM, a pod network and the given Multus networks with bridge
// interfaces, a container disk, cloud-init and the resources a small
// database VM asks for. It is valid against KubeVirt's real CRD schema.
func newVMI(ns, name string, vmUID types.UID, nets []kubevirtv1.Network) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{
		Namespace: ns, Name: name,
		Labels:          map[string]string{"kubevirt.io/vm": name, "app.kubernetes.io/component": vmLabel(len(name))},
		Annotations:     map[string]string{"kubevirt.io/latest-observed-api-version": "v1", "kubevirt.io/storage-observed-api-version": "v1"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachine", Name: name, UID: vmUID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		Finalizers:      []string{"kubevirt.io/virtualMachineControllerFinalize", "foregroundDeleteVirtualMachine"},
	}}
	vmi.Spec.Networks = nets
	for _, n := range nets {
		iface := kubevirtv1.Interface{Name: n.Name}
		if n.Pod != nil {
			iface.InterfaceBindingMethod.Masquerade = &kubevirtv1.InterfaceMasquerade{}
		} else {
			iface.InterfaceBindingMethod.Bridge = &kubevirtv1.InterfaceBridge{}
		}
		vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces, iface)
	}
	vmi.Spec.Domain.CPU = &kubevirtv1.CPU{Cores: 2, Sockets: 1, Threads: 1}
	vmi.Spec.Domain.Memory = &kubevirtv1.Memory{Guest: ptr.To(resource.MustParse("4Gi"))}
	vmi.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")}
	vmi.Spec.Domain.Devices.Disks = []kubevirtv1.Disk{
		{Name: "root", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
		{Name: "cloudinit", DiskDevice: kubevirtv1.DiskDevice{Disk: &kubevirtv1.DiskTarget{Bus: kubevirtv1.DiskBusVirtio}}},
	}
	vmi.Spec.EvictionStrategy = ptr.To(kubevirtv1.EvictionStrategyLiveMigrate)
	vmi.Spec.TerminationGracePeriodSeconds = ptr.To[int64](180)
	vmi.Spec.Volumes = []kubevirtv1.Volume{
		{Name: "root", VolumeSource: kubevirtv1.VolumeSource{ContainerDisk: &kubevirtv1.ContainerDiskSource{Image: "quay.io/containerdisks/fedora:41"}}},
		{Name: "cloudinit", VolumeSource: kubevirtv1.VolumeSource{CloudInitNoCloud: &kubevirtv1.CloudInitNoCloudSource{
			UserData: "#cloud-config\npackages: [postgresql-server, chrony]\nruncmd: [[systemctl, enable, --now, postgresql]]\n",
		}}},
	}
	return vmi
}

// launcherPodTemplate is the pod of the captured review (a real
// virt-launcher pod as kube-apiserver sent it), without its managedFields.
func launcherPodTemplate() (*corev1.Pod, error) {
	var review struct {
		Request struct {
			Object json.RawMessage `json:"object"`
		} `json:"request"`
	}
	if err := json.Unmarshal(loadtest.LauncherPodReview, &review); err != nil {
		return nil, err
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(review.Request.Object, pod); err != nil {
		return nil, err
	}
	pod.ManagedFields = nil
	return pod, nil
}

// launcherPod is tmpl renamed for vmi: its labels, owner, domain annotation
// and a Multus selection element per secondary network.
func launcherPod(tmpl *corev1.Pod, vmi *kubevirtv1.VirtualMachineInstance) (*corev1.Pod, error) {
	pod := tmpl.DeepCopy()
	pod.Namespace, pod.Name = vmi.Namespace, "virt-launcher-"+vmi.Name+"-"+string(vmi.UID)[:5]
	pod.Labels[kubevirtv1.CreatedByLabel] = string(vmi.UID)
	pod.Labels["vm.kubevirt.io/name"], pod.Labels["vmi.kubevirt.io/id"] = vmi.Name, vmi.Name
	pod.Annotations[kubevirtv1.DomainAnnotation] = vmi.Name
	var elems []map[string]string
	for _, n := range vmi.Spec.Networks {
		if n.Multus != nil {
			elems = append(elems, map[string]string{"name": n.Multus.NetworkName, "namespace": vmi.Namespace, "interface": persistentips.PodInterfaceName(n.Name)})
		}
	}
	b, err := json.Marshal(elems)
	if err != nil {
		return nil, err
	}
	pod.Annotations[multus.NetworksAnnotation] = string(b)
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: vmi.Name, UID: vmi.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	return pod, nil
}

// rate is n objects over d, per second.
func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }
