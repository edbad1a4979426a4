// Package migrationid is what a decentralized migration's ID means to
// kvnet: which end of the migration a VirtualMachineInstanceMigration is
// (spec.receive in the target cluster, spec.sendTo in the source), whether
// it still takes part in it, and the cache index by which both the
// migration proxy (proxy.ClusterResolver) and admission (the migration-ids
// validator, through lookup.Facts) find the live VMIMs holding an ID. One
// definition serves both, so that what admission refuses as a second holder
// is exactly what the proxy would refuse as ambiguous.
package migrationid

import (
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"
)

// Role is the end of a decentralized migration a VMIM stands for. A VMIM
// may stand for both (KubeVirt then wants the two IDs equal): both ends of
// a migration can be in one cluster.
type Role string

// The two roles, named as the spec fields that carry their ID.
const (
	Receive Role = "receive"
	Send    Role = "sendTo"
)

// Roles lists every role, in the order checks report them.
var Roles = []Role{Receive, Send}

// Path is the field that carries the role's migration ID.
func (r Role) Path() *field.Path { return field.NewPath("spec", string(r), "migrationID") }

// ID is m's migration ID in role r, "" when m does not play it.
func ID(m *kubevirtv1.VirtualMachineInstanceMigration, r Role) string {
	switch r {
	case Receive:
		if m.Spec.Receive != nil {
			return m.Spec.Receive.MigrationID
		}
	case Send:
		if m.Spec.SendTo != nil {
			return m.Spec.SendTo.MigrationID
		}
	}
	return ""
}

// Live reports whether m still takes part in its migration: not in a final
// phase (Succeeded, Failed) and not being deleted. Only live VMIMs hold
// their IDs: a migration that ended frees its ID for the next one.
func Live(m *kubevirtv1.VirtualMachineInstanceMigration) bool {
	return !m.IsFinal() && m.DeletionTimestamp == nil
}

// IndexField is the informer-cache field index of live VMIMs by role and
// migration ID: List with client.MatchingFields{IndexField: Key(role, id)}
// answers the live VMIMs of every namespace that hold id in role, without
// listing the others. Whoever reads it registers Keys under this name
// before the cache starts.
const IndexField = "kvnet.io/live-migration-id"

// Key is the value of IndexField for migration ID id in role r.
func Key(r Role, id string) string { return string(r) + "/" + id }

// Keys are m's values of IndexField: one per role m plays with a non-empty
// ID while it is live, none once it ended or is being deleted. The cache
// recomputes them on every change, so a VMIM leaves the index when its
// phase becomes final.
func Keys(m *kubevirtv1.VirtualMachineInstanceMigration) []string {
	if !Live(m) {
		return nil
	}
	var keys []string
	for _, r := range Roles {
		if id := ID(m, r); id != "" {
			keys = append(keys, Key(r, id))
		}
	}
	return keys
}
