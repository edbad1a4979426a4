package test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

var nsCounter atomic.Int32

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(t *testing.T, labels map[string]string) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", nsCounter.Add(1), strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := env.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	waitCached(t, &corev1.Namespace{}, client.ObjectKey{Name: name})
	return name
}

// createNAD creates a NAD and waits until kvnet's cache has it, as admission
// reads NADs from the cache.
func createNAD(t *testing.T, namespace, name, resourceName, config string) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	nad := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: config},
	}
	if resourceName != "" {
		nad.Annotations = map[string]string{"k8s.v1.cni.cncf.io/resourceName": resourceName}
	}
	if err := env.Client.Create(context.Background(), nad); err != nil {
		t.Fatalf("creating NAD %s/%s: %v", namespace, name, err)
	}
	waitCached(t, &nadv1.NetworkAttachmentDefinition{}, client.ObjectKeyFromObject(nad))
	return nad
}

// waitCached waits until kvnet's informer cache holds the object.
func waitCached(t *testing.T, obj client.Object, key client.ObjectKey) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := env.Manager.GetCache().Get(context.Background(), key, obj); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%T %s never reached kvnet's cache", obj, key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fromYAML decodes a YAML literal into obj, failing the test on error.
func fromYAML(t *testing.T, y string, obj any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(y), obj); err != nil {
		t.Fatalf("test object: %v", err)
	}
}

const bridgeConfig = `{"cniVersion":"0.4.0","name":"%s","type":"bridge","bridge":"br1"}`
