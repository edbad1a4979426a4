package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/test/framework"
)

// handlerNode is the one Node of the demo; nothing runs on it.
const handlerNode = "node1"

// showHandler creates virt-handler's DaemonSet as virt-operator does for
// the examples' KubeVirt CR (the migration network on its template as
// "<nad>@migration0") and, since no kube-controller-manager runs here, the
// pod the DaemonSet controller would create for node1
// (framework.DaemonSetPod). It
// shows that kvnet gave the pod a migration0 address of the configured pool
// and that its controller bound the address to the pod.
func showHandler(ctx context.Context, c client.Client, root string, say sayFunc) error {
	cfg, err := readConfig(root)
	if err != nil {
		return err
	}
	ic := cfg.Migration.InCluster
	if ic == nil {
		return errors.New("examples/config.yaml has no migration.inCluster: nothing gives virt-handler a migration0 address")
	}
	pool, err := netip.ParsePrefix(ic.Pool.CIDR)
	if err != nil {
		return fmt.Errorf("examples/config.yaml migration.inCluster.pool.cidr: %w", err)
	}
	nadNS, nadName := ic.NAD.Namespace, ic.NAD.Name
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: handlerNode, Labels: map[string]string{
		corev1.LabelHostname: handlerNode, kubevirtv1.NodeSchedulable: "true",
	}}}
	if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Node %s: %w", handlerNode, err)
	}
	ds, err := createHandlerDaemonSet(ctx, c, nadName)
	if err != nil {
		return err
	}
	say("    DaemonSet %s/%s as virt-operator writes it: %s: %s", ds.Namespace, ds.Name, multus.NetworksAnnotation, ds.Spec.Template.Annotations[multus.NetworksAnnotation])
	say("    the demo creates the pod the DaemonSet controller would for %s (no kube-controller-manager here)", handlerNode)
	pod := framework.DaemonSetPod(ds, handlerNode)
	if err := c.Create(ctx, pod); err != nil {
		return fmt.Errorf("creating the virt-handler pod: %w", err)
	}
	lines, err := formatElements(pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	say("    Pod %s/%s as stored (kvnet completed it), %s:", pod.Namespace, pod.Name, multus.NetworksAnnotation)
	for _, line := range lines {
		say("      - %s", line)
	}
	addr, err := migrationAddress(pod, nadNS, nadName, ic.Interface, pool)
	if err != nil {
		return err
	}
	var alloc *migration.Allocation
	err = poll(ctx, kubeVirtWait, "kvnet to bind "+addr.String()+" to pod "+pod.Name, func() error {
		var cm corev1.ConfigMap
		key := client.ObjectKey{Namespace: framework.KvnetNamespace, Name: migration.ObjectName(migration.PoolInCluster, addr.Addr())}
		if err := c.Get(ctx, key, &cm); err != nil {
			return err
		}
		a, err := migration.FromConfigMap(&cm)
		if err != nil {
			return stopPolling{err}
		}
		if a.State != migration.StateBound || a.PodUID != pod.UID || a.Node != handlerNode {
			return fmt.Errorf("allocation is %s for pod %q on node %q", a.State, a.PodName, a.Node)
		}
		alloc = a
		return nil
	})
	if err != nil {
		return err
	}
	say("    kvnet's allocation, bound to the pod and kept for %s:", handlerNode)
	say("      - %s", formatAllocation(alloc))
	return nil
}

// migrationAddress is the one address of the pod's element for the
// migration NAD on iface, checked to lie in the pool.
func migrationAddress(pod *corev1.Pod, nadNS, nadName, iface string, pool netip.Prefix) (netip.Prefix, error) {
	elems, err := multus.Parse(pod.Annotations[multus.NetworksAnnotation])
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, e := range elems {
		if !e.Refers(pod.Namespace, nadNS, nadName) || e.Interface() != iface {
			continue
		}
		var ips []string
		if raw := e.Raw(multus.KeyIPs); raw != nil {
			if err := json.Unmarshal(raw, &ips); err != nil {
				return netip.Prefix{}, fmt.Errorf("pod %s: ips %s: %w", pod.Name, raw, err)
			}
		}
		if len(ips) != 1 {
			return netip.Prefix{}, fmt.Errorf("pod %s: the %s element carries ips %v, want one address", pod.Name, iface, ips)
		}
		p, err := netip.ParsePrefix(ips[0])
		if err != nil || !pool.Contains(p.Addr()) || p.Bits() != pool.Bits() {
			return netip.Prefix{}, fmt.Errorf("pod %s: %s address %q is not an address of pool %s", pod.Name, iface, ips[0], pool)
		}
		return p, nil
	}
	return netip.Prefix{}, fmt.Errorf("pod %s has no %s/%s element on %s: %q", pod.Name, nadNS, nadName, iface, pod.Annotations[multus.NetworksAnnotation])
}

// createHandlerDaemonSet is virt-handler's DaemonSet as virt-operator
// creates it when the KubeVirt CR names a migration network.
func createHandlerDaemonSet(ctx context.Context, c client.Client, nad string) (*appsv1.DaemonSet, error) {
	labels := map[string]string{kubevirtv1.AppLabel: "virt-handler"}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: framework.KubeVirtNamespace, Name: "virt-handler", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: map[string]string{multus.NetworksAnnotation: nad + "@migration0"}},
				Spec: corev1.PodSpec{
					ServiceAccountName: framework.HandlerServiceAccount,
					Containers:         []corev1.Container{{Name: "virt-handler", Image: "quay.io/kubevirt/virt-handler:" + framework.KubeVirtVersion}},
				},
			},
		},
	}
	if err := c.Create(ctx, ds); err != nil {
		return nil, fmt.Errorf("creating virt-handler's DaemonSet: %w", err)
	}
	return ds, nil
}

// readConfig parses examples/config.yaml, the policy kvnet runs with.
func readConfig(root string) (*config.Config, error) {
	return readConfigFile(filepath.Join(root, "examples", "config.yaml"))
}

// readConfigFile parses a kvnet policy file.
func readConfigFile(path string) (*config.Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return config.Parse(b, framework.KvnetNamespace)
}
