package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/test/framework"
)

// fromYAML decodes a YAML literal into obj, failing the test on error.
func fromYAML(t *testing.T, y string, obj any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(y), obj); err != nil {
		t.Fatalf("test object: %v", err)
	}
}

const bridgeConfig = `{"cniVersion":"0.4.0","name":"%s","type":"bridge","bridge":"br1"}`

// warningRecorder collects the admission warnings the API server relays.
type warningRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, text)
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// warningClient returns a client whose warnings land in the recorder.
func warningClient(t *testing.T) (client.Client, *warningRecorder) {
	t.Helper()
	rec := &warningRecorder{}
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = rec
	c, err := client.New(cfg, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c, rec
}

// causes returns the field paths of an Invalid error's causes.
func causes(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		t.Fatalf("want a refusal, the API server accepted the object")
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("want 422 Invalid, got %v", err)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		t.Fatalf("refusal carries no details: %v", err)
	}
	var out []string
	for _, c := range status.Status().Details.Causes {
		out = append(out, c.Field)
	}
	return out
}

// hasCause fails unless the error has a cause for field whose message contains want.
func hasCause(t *testing.T, err error, fieldPath, want string) {
	t.Helper()
	causes(t, err)
	var status apierrors.APIStatus
	errors.As(err, &status)
	for _, c := range status.Status().Details.Causes {
		if c.Field == fieldPath && strings.Contains(c.Message, want) {
			return
		}
	}
	t.Fatalf("no cause for %s containing %q in %v", fieldPath, want, err)
}

// setKubeVirt creates or replaces the cluster's KubeVirt CR (namespace
// kubevirt, name kubevirt) and waits until kvnet's cache has this version.
func setKubeVirt(t *testing.T, spec kubevirtv1.KubeVirtSpec) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kubevirt"}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	kv := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"}}
	err := env.Client.Get(ctx, client.ObjectKeyFromObject(kv), kv)
	switch {
	case apierrors.IsNotFound(err):
		kv.Spec = spec
		err = env.Client.Create(ctx, kv)
	case err == nil:
		kv.Spec = spec
		err = env.Client.Update(ctx, kv)
	}
	if err != nil {
		t.Fatalf("writing the KubeVirt CR: %v", err)
	}
	framework.Eventually(t, "KubeVirt CR version "+kv.ResourceVersion+" in kvnet's cache", 10*time.Second, func() error {
		var cached kubevirtv1.KubeVirt
		if err := env.Manager.GetCache().Get(ctx, client.ObjectKeyFromObject(kv), &cached); err != nil {
			return err
		}
		if cached.ResourceVersion != kv.ResourceVersion {
			return fmt.Errorf("cache has version %s", cached.ResourceVersion)
		}
		return nil
	})
}

// vdpaKubeVirt is a KubeVirt spec declaring the vdpa binding plugin.
func vdpaKubeVirt(migration bool) kubevirtv1.KubeVirtSpec {
	plugin := kubevirtv1.InterfaceBindingPlugin{
		SidecarImage: "registry.example.com/network-vdpa-binding:v1",
		DownwardAPI:  kubevirtv1.DeviceInfo,
	}
	if migration {
		plugin.Migration = &kubevirtv1.InterfaceBindingMigration{}
	}
	return kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{
		// virt-api refuses the memLock vDPA needs without this gate.
		DeveloperConfiguration: &kubevirtv1.DeveloperConfiguration{FeatureGates: []string{lookup.MemLockFeatureGate}},
		NetworkConfiguration:   &kubevirtv1.NetworkConfiguration{Binding: map[string]kubevirtv1.InterfaceBindingPlugin{"vdpa": plugin}},
	}}
}

// createVM creates a VM from YAML in namespace ns with client c.
func createVM(t *testing.T, c client.Client, ns, y string) (*kubevirtv1.VirtualMachine, error) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	fromYAML(t, y, &vm)
	vm.Namespace = ns
	err := c.Create(context.Background(), &vm)
	return &vm, err
}

// getVM reads a VM back from the API server.
func getVM(t *testing.T, ns, name string) *kubevirtv1.VirtualMachine {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &vm); err != nil {
		t.Fatal(err)
	}
	return &vm
}

// waitGone waits until kvnet's cache no longer has the object.
func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	probe := obj.DeepCopyObject().(client.Object)
	framework.Eventually(t, fmt.Sprintf("%s gone from kvnet's cache", client.ObjectKeyFromObject(obj)), 10*time.Second, func() error {
		err := env.Manager.GetCache().Get(context.Background(), client.ObjectKeyFromObject(obj), probe)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (%v)", err)
	})
}
