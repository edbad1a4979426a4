package webhook

import (
	"strings"

	"github.com/kvnet/kvnet/internal/chain"
)

// The webhook label of kvnet_admission_requests_total and
// kvnet_admission_duration_seconds, and the "webhook" key of every log
// line a request writes: one stable, lower-case name per handler, which
// dashboards and alerts may select on (docs/operations.md lists them).
const (
	MetricMutateVM           = "mutate-vm"
	MetricMutateVMI          = "mutate-vmi"
	MetricValidateVM         = "validate-vm"
	MetricValidateVMI        = "validate-vmi"
	MetricValidateMigration  = "validate-vmim"
	MetricMutateLauncherPod  = "mutate-launcher-pod"
	MetricMutateMigrationPod = "mutate-migration-pod"
)

// kindName is the lower-case short name of a VM or VMI kind in metric
// labels: "vm", "vmi".
func kindName(kind chain.Kind) string {
	switch kind {
	case chain.KindVM:
		return "vm"
	case chain.KindVMI:
		return "vmi"
	}
	return strings.ToLower(string(kind))
}
