package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

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
	Store          MappingStore
	MappingsReader client.Reader
}

// mapping returns the published mapping of vmi, "" when there is none.
func (h *StatusRewriter) mapping(ctx context.Context, vmi *kubevirtv1.VirtualMachineInstance) (string, error) {
	hint, ok := vmi.Annotations[AnnotationMapping]
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
	log := logf.FromContext(ctx)
	if req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	var vmi kubevirtv1.VirtualMachineInstance
	if err := json.Unmarshal(req.Object.Raw, &vmi); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the VirtualMachineInstance: %w", err))
	}
	if vmi.Namespace == "" {
		vmi.Namespace = req.Namespace
	}
	if vmi.Status.MigrationState == nil || vmi.Status.MigrationState.TargetState == nil {
		return admission.Allowed("no targetState")
	}
	vmim, err := SourceMigration(ctx, h.Reader, &vmi)
	if err == nil && vmim == nil && h.APIReader != nil {
		var known bool
		if known, err = knowsMigration(ctx, h.Reader, &vmi); err == nil && !known {
			vmim, err = SourceMigration(ctx, h.APIReader, &vmi)
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
	if remote, ok := RemoteOf(&vmi, vmim); ok {
		published, err := h.mapping(ctx, &vmi)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading the migration proxy's published mappings: %w", err))
		}
		address, ports = Rewrite(remote, published)
	}
	ops, err := statusOps(req.Object.Raw, address, ports)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	if len(ops) == 0 {
		return admission.Allowed("")
	}
	if address == "" {
		log.V(1).Info("holding back the remote migration endpoint until the proxy publishes relays", "migrationID", vmim.Spec.SendTo.MigrationID)
	} else {
		log.Info("pointing the source virt-handler at the migration proxy", "migrationID", vmim.Spec.SendTo.MigrationID, "address", address, "ports", ports)
	}
	return admission.Patched("", ops...)
}

// statusOps returns the JSON patch operations that set the two top-level
// fields to address and ports (empty: remove). It reads the raw request to
// know which keys are present, since an empty but present ports map is not
// the same as none to virt-handler (it waits only for a nil map).
func statusOps(raw []byte, address string, ports map[string]int) ([]jsonpatch.JsonPatchOperation, error) {
	var obj struct {
		Status struct {
			MigrationState map[string]json.RawMessage `json:"migrationState"`
		} `json:"status"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("decoding status.migrationState: %w", err)
	}
	ms := obj.Status.MigrationState
	const base = "/status/migrationState/"
	var ops []jsonpatch.JsonPatchOperation

	curAddr, hasAddr := ms["targetNodeAddress"]
	switch {
	case address == "" && hasAddr:
		ops = append(ops, jsonpatch.NewOperation("remove", base+"targetNodeAddress", nil))
	case address != "":
		var cur string
		if !hasAddr || json.Unmarshal(curAddr, &cur) != nil || cur != address {
			ops = append(ops, jsonpatch.NewOperation("add", base+"targetNodeAddress", address))
		}
	}

	curPorts, hasPorts := ms["targetDirectMigrationNodePorts"]
	switch {
	case ports == nil && hasPorts:
		ops = append(ops, jsonpatch.NewOperation("remove", base+"targetDirectMigrationNodePorts", nil))
	case ports != nil:
		var cur map[string]int
		if !hasPorts || json.Unmarshal(curPorts, &cur) != nil || !maps.Equal(cur, ports) {
			ops = append(ops, jsonpatch.NewOperation("add", base+"targetDirectMigrationNodePorts", ports))
		}
	}
	return ops, nil
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
