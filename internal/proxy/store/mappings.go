package store

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultMappingsName is the ConfigMap, in kvnet's namespace, that holds
// the proxy's published mappings.
const DefaultMappingsName = "kvnet-migration-proxy-mappings"

// MappingStore is where the proxy publishes its mappings and the one place
// the status rewrite trusts: a ConfigMap in kvnet's namespace that only the
// proxy's ServiceAccount may write (the chart's Role grants update/patch on
// this one name). The VMI annotation AnnotationMapping is only a trigger
// (it makes the API server call the rewrite) and a hint for cache
// freshness; whoever can edit a VMI can write it, so its content never
// steers a stream.
//
// The ConfigMap must exist: the chart creates it, so that the proxy's
// ServiceAccount (in sidecar mode KubeVirt's synchronization controller's)
// needs no create in kvnet's namespace, where any ConfigMap it could
// create might pose as one of kvnet's allocations. Only with Create set
// (kvnet proxy --create-objects, outside the chart) does Put create it.
type MappingStore struct {
	Namespace, Name string
	Create          bool
}

func (s MappingStore) key() types.NamespacedName {
	name := s.Name
	if name == "" {
		name = DefaultMappingsName
	}
	return types.NamespacedName{Namespace: s.Namespace, Name: name}
}

// Key is a VMI's entry in the ConfigMap. Namespaces hold no dot, so the
// first dot separates the two parts unambiguously.
func Key(vmi types.NamespacedName) string { return vmi.Namespace + "." + vmi.Name }

// Put publishes (value "") or removes a VMI's mapping with a merge patch,
// which needs no read first and leaves the other VMIs' entries alone.
func (s MappingStore) Put(ctx context.Context, c client.Client, vmi types.NamespacedName, value string) error {
	k := s.key()
	var v any
	if value != "" {
		v = value
	}
	patch, _ := json.Marshal(map[string]any{"data": map[string]any{Key(vmi): v}}) // cannot fail
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}
	err := c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
	if apierrors.IsNotFound(err) {
		if value == "" {
			return nil
		}
		if !s.Create {
			return fmt.Errorf("publishing the mapping of VMI %s: %w", vmi, &MissingObjectError{Kind: "ConfigMap", Key: k})
		}
		cm.Data = map[string]string{Key(vmi): value}
		if err = c.Create(ctx, cm); apierrors.IsAlreadyExists(err) {
			err = c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
		}
	}
	if err != nil {
		return fmt.Errorf("publishing the mapping of VMI %s in ConfigMap %s: %w", vmi, k, err)
	}
	return nil
}

// Get returns a VMI's published mapping from r ("" if none).
func (s MappingStore) Get(ctx context.Context, r client.Reader, vmi types.NamespacedName) (string, error) {
	var cm corev1.ConfigMap
	if err := r.Get(ctx, s.key(), &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("reading the migration proxy mappings %s: %w", s.key(), err)
	}
	return cm.Data[Key(vmi)], nil
}

// MissingObjectError is an object in kvnet's namespace that the proxy
// writes but does not create (the chart does, see MappingStore), and that
// is not there. The message names it and both ways to make it.
type MissingObjectError struct {
	Kind string // ConfigMap or Lease
	Key  types.NamespacedName
}

func (e *MissingObjectError) Error() string {
	return fmt.Sprintf("%s %s does not exist: kvnet's chart creates it (helm upgrade restores it); without the chart create it, or run kvnet proxy with --create-objects and RBAC to create it", e.Kind, e.Key)
}

// AnnotationMapping is the VMI annotation where the proxy publishes its
// relays for the VMI's current decentralized migration. The admission
// handler reads it from the object being written, so the write that
// publishes it already rewrites the status in the same request.
const AnnotationMapping = "kvnet.io/migration-proxy"

// Mapping is the value of AnnotationMapping.
type Mapping struct {
	// MigrationID is the source VMIM's spec.sendTo.migrationID: a mapping
	// never applies to another migration of the same VMI.
	MigrationID string `json:"migrationID"`
	// Address is the proxy's own address, reachable from the source
	// virt-handlers (the value of --advertise-address).
	Address string `json:"address"`
	// Target is the remote targetState.nodeAddress the relays dial.
	Target string `json:"target"`
	// Ports maps each remote port (a key of
	// targetState.directMigrationNodePorts) to the local relay port.
	Ports map[string]string `json:"ports"`
}

// Encode renders m deterministically (encoding/json sorts map keys), so an
// unchanged mapping never causes a write.
func (m Mapping) Encode() string {
	b, _ := json.Marshal(m) // strings and a string map: cannot fail
	return string(b)
}

// DecodeMapping parses the annotation value.
func DecodeMapping(s string) (Mapping, error) {
	var m Mapping
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return Mapping{}, fmt.Errorf("annotation %s: %w", AnnotationMapping, err)
	}
	return m, nil
}
