package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultBindingsName is the ConfigMap, in kvnet's namespace, that holds
// the target side's migration bindings.
const DefaultBindingsName = "kvnet-migration-proxy-bindings"

// Binding ties a receiving migration to the peer proxy that first
// presented its ID. It lasts as long as the receiving VMIM it was made
// for (Namespace, VMIM, UID): once that VMIM has ended or is gone the
// collector removes it.
type Binding struct {
	MigrationID string    `json:"migrationID"`
	Peer        string    `json:"peer"`
	Namespace   string    `json:"namespace"`
	VMIM        string    `json:"vmim"`
	UID         types.UID `json:"uid"`
}

// BindingStore keeps the bindings in one ConfigMap in kvnet's namespace,
// one key per migration, so that a new leader, or a second replica serving
// the hop port, finds them. Besides kvnet's own webhook ServiceAccount
// (which manages its namespace's allocation ConfigMaps), only the proxy's
// ServiceAccount may write it (the chart's Role names it in
// resourceNames); namespace users cannot write in kvnet's namespace at
// all, so nothing they write (VMIMs, VMIs, their annotations) can rebind a
// migration to another peer.
//
// Every write carries the resourceVersion it was decided on (an optimistic
// lock): of two replicas binding one ID at once, the second one's write
// conflicts, it re-reads, finds the first one's entry and refuses. Reads go
// to Reader (a cache of that one ConfigMap); the API is read only after a
// conflict or a cache miss.
//
// Like the mappings (MappingStore), the ConfigMap must exist unless Create
// is set: while it is missing every stream is refused, and the refusal's
// MissingObjectError names it.
type BindingStore struct {
	Namespace, Name string
	Create          bool
	// Reader is a cache of the ConfigMap, APIReader reads it live after a
	// conflict, Client writes it.
	Reader, APIReader client.Reader
	Client            client.Client
}

func (s *BindingStore) key() types.NamespacedName {
	name := s.Name
	if name == "" {
		name = DefaultBindingsName
	}
	return types.NamespacedName{Namespace: s.Namespace, Name: name}
}

// plainID is a migration ID that is already a valid ConfigMap key and
// cannot be mistaken for a digest key (those start with "_").
var plainID = regexp.MustCompile(`^[a-zA-Z0-9][-._a-zA-Z0-9]*$`)

// BindingKey is a migration's key in the ConfigMap: the ID itself when it
// is a valid key, else "_" and the hex SHA-256 of the ID (a preamble may
// carry any 255 bytes; the value keeps the ID).
func BindingKey(id string) string {
	if len(id) <= 200 && plainID.MatchString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "_" + hex.EncodeToString(sum[:])
}

// maxBindConflicts bounds the retries of one Bind; each conflict means
// another binding landed in between, so this is only reached under a
// storm of new migrations.
const maxBindConflicts = 8

// Bind records b unless its migration is bound to another peer, and
// says whether b.Peer holds it (the target server's Bindings).
func (s *BindingStore) Bind(ctx context.Context, b Binding) (bool, error) {
	k, key := s.key(), BindingKey(b.MigrationID)
	value, _ := json.Marshal(b) // cannot fail
	var cm corev1.ConfigMap
	err := s.Reader.Get(ctx, k, &cm)
	if apierrors.IsNotFound(err) && !s.Create {
		// The cache may not have a ConfigMap created a moment ago.
		if err = s.APIReader.Get(ctx, k, &cm); apierrors.IsNotFound(err) {
			return false, fmt.Errorf("binding migration %q: %w", b.MigrationID, &MissingObjectError{Kind: "ConfigMap", Key: k})
		}
	}
	for range maxBindConflicts {
		if apierrors.IsNotFound(err) {
			cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}, Data: map[string]string{key: string(value)}}
			if err = s.Client.Create(ctx, &cm); err == nil {
				return true, nil
			}
			if apierrors.IsAlreadyExists(err) {
				err = s.APIReader.Get(ctx, k, &cm)
				continue
			}
			return false, fmt.Errorf("creating the migration bindings %s: %w", k, err)
		}
		if err != nil {
			return false, fmt.Errorf("reading the migration bindings %s: %w", k, err)
		}
		if raw, ok := cm.Data[key]; ok {
			cur, err := DecodeBinding(raw)
			if err != nil {
				return false, fmt.Errorf("migration bindings %s key %s: %w", k, key, err)
			}
			if cur.Peer != b.Peer {
				return false, nil
			}
			if cur.UID == b.UID {
				return true, nil
			}
			// The same peer, a newer VMIM with the same ID: the entry
			// follows it, so that the collector keeps it while it runs.
		}
		orig := cm.DeepCopy()
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[key] = string(value)
		err = s.Client.Patch(ctx, &cm, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsConflict(err):
			err = s.APIReader.Get(ctx, k, &cm)
		default:
			return false, fmt.Errorf("writing the binding of migration %q to peer %s in %s: %w", b.MigrationID, b.Peer, k, err)
		}
	}
	return false, fmt.Errorf("binding migration %q in %s: %d conflicting writes in a row", b.MigrationID, k, maxBindConflicts)
}

// Entries returns the ConfigMap as the cache has it (nil when it does not
// exist) and its decoded bindings by key; undecodable Entries are left out.
func (s *BindingStore) Entries(ctx context.Context) (*corev1.ConfigMap, map[string]Binding, error) {
	var cm corev1.ConfigMap
	if err := s.Reader.Get(ctx, s.key(), &cm); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("reading the migration bindings %s: %w", s.key(), err)
	}
	out := make(map[string]Binding, len(cm.Data))
	for k, v := range cm.Data {
		if b, err := DecodeBinding(v); err == nil {
			out[k] = b
		}
	}
	return &cm, out, nil
}

// Forget removes keys from cm with an optimistic lock on cm's
// resourceVersion, so that an entry rebound since cm was read survives
// (the write conflicts and the caller decides again).
func (s *BindingStore) Forget(ctx context.Context, cm *corev1.ConfigMap, keys []string) error {
	orig := cm.DeepCopy()
	cm = cm.DeepCopy()
	for _, k := range keys {
		delete(cm.Data, k)
	}
	if err := s.Client.Patch(ctx, cm, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("removing %d ended migration bindings from %s: %w", len(keys), s.key(), err)
	}
	return nil
}

// DecodeBinding reads one entry of the ConfigMap.
func DecodeBinding(raw string) (Binding, error) {
	var b Binding
	if err := json.Unmarshal([]byte(raw), &b); err != nil {
		return Binding{}, fmt.Errorf("decoding a migration binding: %w", err)
	}
	if b.Peer == "" {
		return Binding{}, fmt.Errorf("decoding a migration binding: no peer")
	}
	return b, nil
}
