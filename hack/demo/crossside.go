package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

// side is one cluster of the cross-cluster demo: its control plane, kvnet
// webhook, and the pods kvnet gave migration addresses, with those
// addresses (every one on loopback, so that the processes can bind them).
type side struct {
	name       string
	dir        string
	te         *envtest.Environment
	c          client.Client
	kubeconfig string
	kvnet      *kvnetProcess
	proxy      *kvnetProcess
	pool       netip.Prefix // the in-cluster migration pool
	crossNet   netip.Prefix // the network of the cross-cluster addresses

	handlerAddr   netip.Addr // the virt-handler pod's migration0
	proxyAddr     netip.Addr // the proxy pod's migration0
	proxyHopAddr  netip.Addr // the proxy pod's crosscluster0
	crossAddrUsed int        // cross-cluster allocations in this cluster
}

// sideConfig is kvnet's policy in one cluster: an in-cluster pool for
// virt-handler and the proxy (alsoInCluster), and a short cross-cluster
// list for the proxy only. n keeps the two clusters' loopback ranges apart.
func sideConfig(n int) string {
	return fmt.Sprintf(`excludedNamespaces: [kube-system, kvnet-system]
migration:
  namespace: kubevirt
  inCluster:
    nad: kubevirt/migration-net
    pool:
      cidr: 127.0.2%[1]d.0/24
      ranges: [127.0.2%[1]d.10-127.0.2%[1]d.50]
  crossCluster:
    nad: kubevirt/crosscluster-net
    addresses: [127.0.3%[1]d.10/24, 127.0.3%[1]d.11/24]
    alsoInCluster: true
`, n)
}

// startSide starts cluster n's control plane and kvnet, creates the
// migration NADs, a virt-handler pod (as its DaemonSet would) and a proxy
// pod (as its ReplicaSet would), and reads the addresses kvnet gave them.
// The caller stops it.
func startSide(ctx context.Context, o Options, n int, name string, say sayFunc) (_ *side, err error) {
	s := &side{name: name, dir: filepath.Join(o.Dir, "crosscluster", name)}
	if err := os.RemoveAll(s.dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(s.dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(sideConfig(n)), 0o644); err != nil {
		return nil, err
	}
	cfg, err := readConfigFile(cfgPath)
	if err != nil {
		return nil, err
	}
	if s.pool, err = netip.ParsePrefix(cfg.Migration.InCluster.Pool.CIDR); err != nil {
		return nil, err
	}
	cc, err := netip.ParsePrefix(cfg.Migration.CrossCluster.Addresses[0])
	if err != nil {
		return nil, err
	}
	s.crossNet = cc.Masked()
	say("==> %s: kube-apiserver, etcd and kvnet (policy %s)", name, cfgPath)
	if s.te, err = startControlPlane(func(string, ...any) {}, ""); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	if s.c, _, s.kubeconfig, err = adminClient(s.te, s.dir); err != nil {
		return nil, err
	}
	ko := Options{Root: o.Root, Kvnet: o.Kvnet, Dir: s.dir, Config: cfgPath, migrationProxy: n == 1}
	if s.kvnet, err = setUpKvnet(ctx, s.c, ko, s.kubeconfig, func(string, ...any) {}); err != nil {
		return nil, err
	}
	if err := waitReady(ctx, s.kvnet); err != nil {
		return nil, err
	}
	if err := waitInjected(ctx, s.c, "kvnet"); err != nil {
		return nil, err
	}
	if err := s.addressPods(ctx, say); err != nil {
		return nil, err
	}
	return s, nil
}

// addressPods creates the migration NADs and the two pods, and checks what
// kvnet gave each: virt-handler one migration0 address and no
// crosscluster0, the proxy one of each.
func (s *side) addressPods(ctx context.Context, say sayFunc) error {
	if err := ensureNamespace(ctx, s.c, framework.KubeVirtNamespace); err != nil {
		return err
	}
	for _, nad := range []string{"migration-net", "crosscluster-net"} {
		obj := newNAD(framework.KubeVirtNamespace, nad, `{"cniVersion": "0.4.0", "name": "`+nad+`", "type": "macvlan", "master": "eth1"}`)
		if err := s.c.Create(ctx, obj); err != nil {
			return fmt.Errorf("%s: creating NAD %s: %w", s.name, nad, err)
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.name + "-node", Labels: map[string]string{corev1.LabelHostname: s.name + "-node"}}}
	if err := s.c.Create(ctx, node); err != nil {
		return err
	}
	ds, err := createHandlerDaemonSet(ctx, s.c, "migration-net")
	if err != nil {
		return err
	}
	handler, err := s.createAddressed(ctx, framework.DaemonSetPod(ds, node.Name))
	if err != nil {
		return err
	}
	proxyPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: framework.KubeVirtNamespace, GenerateName: "kvnet-migration-proxy-",
			Labels: map[string]string{kubevirtv1.AppLabel: webhook.MigrationProxyLabelValue}},
		// The synchronization controller's identity, which the proxy has
		// in sidecar mode: only KubeVirt's accounts hold migration addresses.
		Spec: corev1.PodSpec{ServiceAccountName: framework.SyncServiceAccount, Containers: []corev1.Container{{Name: "proxy", Image: "ghcr.io/kvnet/kvnet"}}},
	}
	proxyPod, err = s.createAddressed(ctx, proxyPod)
	if err != nil {
		return err
	}
	p, err := migrationAddress(handler, framework.KubeVirtNamespace, "migration-net", "migration0", s.pool)
	if err != nil {
		return err
	}
	s.handlerAddr = p.Addr()
	if _, err := podElement(handler, "crosscluster-net"); err == nil {
		return fmt.Errorf("%s: virt-handler pod %s got a cross-cluster element: %s", s.name, handler.Name, handler.Annotations[multus.NetworksAnnotation])
	}
	if p, err = migrationAddress(proxyPod, framework.KubeVirtNamespace, "migration-net", "migration0", s.pool); err != nil {
		return err
	}
	s.proxyAddr = p.Addr()
	if p, err = migrationAddress(proxyPod, framework.KubeVirtNamespace, "crosscluster-net", "crosscluster0", s.crossNet); err != nil {
		return err
	}
	s.proxyHopAddr = p.Addr()
	say("    virt-handler pod %s: migration0 %s, no crosscluster0", handler.Name, s.handlerAddr)
	say("    proxy pod %s: migration0 %s, crosscluster0 %s", proxyPod.Name, s.proxyAddr, s.proxyHopAddr)
	return s.countCrossCluster(ctx, proxyPod)
}

// createAddressed creates a pod kvnet's migration-pods webhook completes.
// kvnet reads the NADs from its cache; until the cache has them, it refuses
// the pod naming the NAD, so a server-side dry run (which reserves nothing)
// is repeated until it passes.
func (s *side) createAddressed(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	err := poll(ctx, 30*time.Second, s.name+": kvnet to see the migration NADs", func() error {
		err := s.c.Create(ctx, pod.DeepCopy(), client.DryRunAll)
		if err != nil && !strings.Contains(err.Error(), "does not exist") {
			return stopPolling{err}
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.name, err)
	}
	if err := s.c.Create(ctx, pod); err != nil {
		return nil, fmt.Errorf("%s: creating pod %s: %w", s.name, pod.GenerateName, err)
	}
	return pod, nil
}

// countCrossCluster counts kvnet's cross-cluster allocations once its
// controller has bound the proxy's: exactly one, the proxy pod's.
func (s *side) countCrossCluster(ctx context.Context, proxyPod *corev1.Pod) error {
	return poll(ctx, time.Minute, s.name+": kvnet to bind the proxy's cross-cluster address", func() error {
		var cms corev1.ConfigMapList
		if err := s.c.List(ctx, &cms, client.InNamespace(framework.KvnetNamespace), client.MatchingLabels{migration.LabelPool: migration.PoolCrossCluster}); err != nil {
			return err
		}
		s.crossAddrUsed = len(cms.Items)
		for _, cm := range cms.Items {
			a, err := migration.FromConfigMap(&cm)
			if err != nil {
				return stopPolling{err}
			}
			if a.PodUID != proxyPod.UID {
				return fmt.Errorf("cross-cluster %s is %s for pod %q", a.CIDR(), a.State, a.PodName)
			}
		}
		if s.crossAddrUsed != 1 {
			return fmt.Errorf("%d cross-cluster allocations, want the proxy's one", s.crossAddrUsed)
		}
		return nil
	})
}

func (s *side) stop() {
	if s.proxy != nil {
		s.proxy.stop()
	}
	if s.kvnet != nil {
		s.kvnet.stop()
	}
	if s.te != nil {
		_ = s.te.Stop()
	}
}

// newNAD is a NetworkAttachmentDefinition with the given CNI config.
func newNAD(ns, name, cniConfig string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"config": cniConfig},
	}}
}
