package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/types"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/proxy/store"
	"github.com/kvnet/kvnet/webhook"
)

const webhookName = "mutate-vmi-migration-status"

// StatusRewriter is the mutating admission handler for UPDATEs of
// VirtualMachineInstances that carry status.migrationState.targetState. For
// the source VMI of a decentralized migration it makes the two top-level
// fields the source virt-handler dials (targetNodeAddress,
// targetDirectMigrationNodePorts) point at the proxy's relays, or empties
// them until the relays are published, so the remote node address, which the
// source node cannot reach, never gets through. targetState stays truthful:
// it is the proxy's input and the record of the real endpoint.
//
// VMIs have no status subresource, so every status writer (virt-handler,
// virt-controller, the synchronization controller) goes through this rule.
type StatusRewriter struct {
	// Reader answers the VMIM lookup; kvnet passes the manager's cache.
	Reader client.Reader
	// APIReader, if set, is asked only when Reader knows no migration with
	// the VMI's status.migrationState.migrationUID at all: the cache is then
	// behind (a VMIM created moments ago), and missing a source migration
	// would let the unreachable address through. Local and target-side
	// migrations are in the cache and never cost an API call.
	APIReader client.Reader
	// Store is where the proxy publishes its mappings, and MappingsReader
	// (a cache of that one ConfigMap) reads it; the API (APIReader) is
	// asked only when the VMI's trigger annotation differs from the cached
	// entry, i.e. the cache is behind the proxy's latest publication. The
	// annotation's own content is never used: any VMI editor can write it.
	Store          store.MappingStore
	MappingsReader client.Reader
}

// mapping returns the published mapping of vmi, "" when there is none.
func (h *StatusRewriter) mapping(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (string, error) {
	hint, ok := vmi.Annotations[store.AnnotationMapping]
	if !ok || h.MappingsReader == nil {
		return "", nil
	}
	key := client.ObjectKeyFromObject(vmi)
	m, err := h.Store.Get(ctx, h.MappingsReader, key)
	if err != nil || m == hint || h.APIReader == nil {
		return m, err
	}
	return h.Store.Get(ctx, h.APIReader, key)
}

// Handle implements admission.Handler.
func (h *StatusRewriter) Handle(ctx context.Context, req admission.Request) admission.Response {
	return webhook.Serve(ctx, webhookName, req, h.rewrite)
}

func (h *StatusRewriter) rewrite(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	view, err := decodeStatusView(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	ms := view.Status.MigrationState
	if ms == nil || ms.TargetState == nil {
		return admission.Allowed("no targetState")
	}
	vmi := view.vmi(req.Namespace)
	vmim, err := SourceMigration(ctx, h.Reader, vmi)
	if err == nil && vmim == nil && h.APIReader != nil {
		var known bool
		if known, err = knowsMigration(ctx, h.Reader, vmi); err == nil && !known {
			vmim, err = SourceMigration(ctx, h.APIReader, vmi)
		}
	}
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("looking up the VMI's source migration: %w", err))
	}
	if vmim == nil {
		return admission.Allowed("not the source of a decentralized migration")
	}
	var address string
	var ports map[string]int
	if remote, ok := RemoteOf(vmi, vmim); ok {
		published, err := h.mapping(ctx, vmi)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading the migration proxy's published mappings: %w", err))
		}
		address, ports = Rewrite(remote, published)
	}
	ops := ms.ops(address, ports)
	if len(ops) == 0 {
		return admission.Allowed("")
	}
	log := logf.FromContext(ctx)
	if address == "" {
		log.V(1).Info("holding back the remote migration endpoint until the proxy publishes relays", "migrationID", vmim.Spec.SendTo.MigrationID)
	} else {
		log.Info("pointing the source virt-handler at the migration proxy", "migrationID", vmim.Spec.SendTo.MigrationID, "address", address, "ports", ports)
	}
	return admission.Patched("", ops...)
}

// statusView is the part of a VMI the rewrite reads: its identity, its
// annotations (the mapping hint) and status.migrationState's migration uid,
// target state and the two fields it may rewrite. Decoding only these, once,
// keeps the VMI's spec, the rest of its status and its managedFields (most
// of a real VMI's bytes) out of the hot path; the patch touches nothing else.
type statusView struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		MigrationState *migrationStateView `json:"migrationState"`
	} `json:"status"`
}

// migrationStateView keeps the two rewritten fields raw: a present key
// (even null or an empty map) is not the same as none to virt-handler, which
// waits only for a nil ports map, so only their presence and values matter.
type migrationStateView struct {
	MigrationUID      types.UID                                              `json:"migrationUid"`
	TargetState       *kubevirtv1.VirtualMachineInstanceMigrationTargetState `json:"targetState"`
	TargetNodeAddress json.RawMessage                                        `json:"targetNodeAddress"`
	TargetPorts       json.RawMessage                                        `json:"targetDirectMigrationNodePorts"`
}

func decodeStatusView(raw []byte) (*statusView, error) {
	var v statusView
	if err := apijson.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("decoding the VirtualMachineInstance's metadata and status.migrationState: %w", err)
	}
	return &v, nil
}

// vmi is the VirtualMachineInstance SourceMigration, RemoteOf and the
// mapping lookup read, with only the fields they read set.
func (v *statusView) vmi(namespace string) *kubevirtv1.VirtualMachineInstance {
	vmi := &kubevirtv1.VirtualMachineInstance{}
	vmi.Name, vmi.Namespace, vmi.Annotations = v.Metadata.Name, v.Metadata.Namespace, v.Metadata.Annotations
	if vmi.Namespace == "" {
		vmi.Namespace = namespace
	}
	if ms := v.Status.MigrationState; ms != nil {
		vmi.Status.MigrationState = &kubevirtv1.VirtualMachineInstanceMigrationState{MigrationUID: ms.MigrationUID, TargetState: ms.TargetState}
	}
	return vmi
}

// ops returns the JSON patch operations that set the two top-level fields
// to address and ports (empty: remove), and none for a field that already
// holds its value: the rewrite knows exactly what it changes, so the patch
// is built from that rather than from a diff of the whole object.
func (ms *migrationStateView) ops(address string, ports map[string]int) []jsonpatch.JsonPatchOperation {
	const base = "/status/migrationState/"
	var ops []jsonpatch.JsonPatchOperation
	switch {
	case address == "" && ms.TargetNodeAddress != nil:
		ops = append(ops, jsonpatch.NewOperation("remove", base+"targetNodeAddress", nil))
	case address != "":
		var cur string
		if ms.TargetNodeAddress == nil || json.Unmarshal(ms.TargetNodeAddress, &cur) != nil || cur != address {
			ops = append(ops, jsonpatch.NewOperation("add", base+"targetNodeAddress", address))
		}
	}
	switch {
	case ports == nil && ms.TargetPorts != nil:
		ops = append(ops, jsonpatch.NewOperation("remove", base+"targetDirectMigrationNodePorts", nil))
	case ports != nil:
		var cur map[string]int
		if ms.TargetPorts == nil || json.Unmarshal(ms.TargetPorts, &cur) != nil || !maps.Equal(cur, ports) {
			ops = append(ops, jsonpatch.NewOperation("add", base+"targetDirectMigrationNodePorts", ports))
		}
	}
	return ops
}

// knowsMigration reports whether r holds the VMIM the VMI's migrationState
// names. A VMI without a migrationUID counts as known: there is nothing to
// wait for.
func knowsMigration(ctx context.Context, r client.Reader, vmi *kubevirtv1.VirtualMachineInstance) (bool, error) {
	ms := vmi.Status.MigrationState
	if ms == nil || ms.MigrationUID == "" {
		return true, nil
	}
	var list kubevirtv1.VirtualMachineInstanceMigrationList
	if err := r.List(ctx, &list, client.InNamespace(vmi.Namespace)); err != nil {
		return false, fmt.Errorf("listing VirtualMachineInstanceMigrations in %s: %w", vmi.Namespace, err)
	}
	for i := range list.Items {
		if list.Items[i].UID == ms.MigrationUID {
			return true, nil
		}
	}
	return false, nil
}
