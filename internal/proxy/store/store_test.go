package store

import (
	"context"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// The proxy writes its mappings and bindings into ConfigMaps the chart
// created (empty), and creates a missing one only when told to: otherwise
// the write fails with a MissingObjectError naming the ConfigMap, and
// nothing is created.
func TestStoresCreateOnlyWhenTold(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	vmi := types.NamespacedName{Namespace: "tenant", Name: "web"}
	b := Binding{MigrationID: "m1", Peer: "east", Namespace: "tenant", VMIM: "in", UID: "uid-1"}
	write := map[string]struct {
		name string
		do   func(c client.Client, create bool) error
		has  string // the key the write leaves in the ConfigMap
	}{
		"mappings": {DefaultMappingsName, func(c client.Client, create bool) error {
			return MappingStore{Namespace: "kvnet-system", Create: create}.Put(context.Background(), c, vmi, "m")
		}, Key(vmi)},
		"bindings": {DefaultBindingsName, func(c client.Client, create bool) error {
			st := &BindingStore{Namespace: "kvnet-system", Create: create, Reader: c, APIReader: c, Client: c}
			ok, err := st.Bind(context.Background(), b)
			if err == nil && !ok {
				return errors.New("not bound")
			}
			return err
		}, "m1"},
	}
	for name, w := range write {
		key := client.ObjectKey{Namespace: "kvnet-system", Name: w.name}
		for _, tc := range []struct {
			what          string
			exists        bool
			create        bool
			wantMissing   bool
			wantConfigMap bool
		}{
			{what: "chart-created", exists: true, wantConfigMap: true},
			{what: "missing", wantMissing: true},
			{what: "missing, --create-objects", create: true, wantConfigMap: true},
		} {
			t.Run(name+"/"+tc.what, func(t *testing.T) {
				cb := fake.NewClientBuilder().WithScheme(s)
				if tc.exists {
					cb = cb.WithObjects(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}})
				}
				c := cb.Build()
				err := w.do(c, tc.create)
				var missing *MissingObjectError
				if got := errors.As(err, &missing); got != tc.wantMissing {
					t.Fatalf("error %v, want a MissingObjectError: %v", err, tc.wantMissing)
				}
				if tc.wantMissing {
					if missing.Kind != "ConfigMap" || missing.Key != key || !strings.Contains(err.Error(), "ConfigMap "+key.String()+" does not exist") {
						t.Errorf("error %q (%+v) does not name ConfigMap %s", err, missing, key)
					}
				} else if err != nil {
					t.Fatal(err)
				}
				var cm corev1.ConfigMap
				err = c.Get(context.Background(), key, &cm)
				if tc.wantConfigMap {
					if err != nil {
						t.Fatal(err)
					}
					if _, ok := cm.Data[w.has]; !ok {
						t.Errorf("ConfigMap %s holds %v, want key %s", key, cm.Data, w.has)
					}
				} else if !apierrors.IsNotFound(err) {
					t.Errorf("ConfigMap %s after the refused write: %v, want none created", key, err)
				}
			})
		}
	}
}
