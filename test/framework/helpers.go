package framework

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// CacheTimeout bounds the wait for kvnet's informer cache to see a write.
// The cache answers in milliseconds on an idle machine; the deadline is
// generous because CI machines are shared, and it only turns a hang into a
// message.
const CacheTimeout = 60 * time.Second

// Eventually polls cond until it returns nil, failing the test with cond's
// last error once timeout has passed. It is the one poll loop of kvnet's
// tests: a condition with a generous deadline, never a sleep and never a
// timing assertion.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		last = cond()
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: still not true after %s: %v", what, timeout, last)
	}
}

// WaitCached waits until kvnet's informer cache holds the object under key:
// admission reads from the cache, so a test that just created an object
// the webhook will look up must wait for it there.
func (e *Env) WaitCached(t testing.TB, obj client.Object, key client.ObjectKey) {
	t.Helper()
	Eventually(t, fmt.Sprintf("%T %s in kvnet's cache", obj, key), CacheTimeout, func() error {
		return e.Manager.GetCache().Get(context.Background(), key, obj)
	})
}

var nsCounter atomic.Int32

// NewNamespace creates a namespace for one test, named after the test,
// deletes it when the test ends, and waits until kvnet's cache has it (the
// webhooks read namespace labels from the cache). Tests isolate themselves
// by namespace on a shared control plane.
func (e *Env) NewNamespace(t testing.TB, labels map[string]string) string {
	t.Helper()
	name := fmt.Sprintf("t%d-%s", nsCounter.Add(1), strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), ns) })
	e.WaitCached(t, &corev1.Namespace{}, client.ObjectKey{Name: name})
	return name
}

// CreateNAD creates a NetworkAttachmentDefinition with the given CNI config
// (and the device-plugin resource annotation when resourceName is set), and
// waits until kvnet's cache has it, as admission reads NADs from the cache.
func (e *Env) CreateNAD(t testing.TB, namespace, name, resourceName, config string) *nadv1.NetworkAttachmentDefinition {
	t.Helper()
	nad := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: config},
	}
	if resourceName != "" {
		nad.Annotations = map[string]string{"k8s.v1.cni.cncf.io/resourceName": resourceName}
	}
	if err := e.Client.Create(context.Background(), nad); err != nil {
		t.Fatalf("creating NAD %s/%s: %v", namespace, name, err)
	}
	e.WaitCached(t, &nadv1.NetworkAttachmentDefinition{}, client.ObjectKeyFromObject(nad))
	return nad
}

// FreePort returns a loopback port free at the moment of the call, for a
// server that cannot be handed a listener (controller-runtime's webhook
// server takes only a port). Another process may take it before the server
// binds it; servers kvnet's framework starts get their listener instead.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// RunManager starts mgr in the background for the rest of the test and
// returns stop, which ends it as SIGTERM does (a leader releases its lease)
// and reports the manager's error; stop runs at cleanup if the test did
// not call it, and only once.
func RunManager(t testing.TB, mgr manager.Manager) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
