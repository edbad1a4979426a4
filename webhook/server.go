// Package webhook is kvnet's admission edge: it turns AdmissionReviews into
// chain requests, chain results into one JSON patch or a field-error
// response, and registers the handlers on controller-runtime's webhook server.
package webhook

import (
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
)

// Paths kvnet serves. The chart and Configurations use the same constants.
const (
	PathMutateVM            = "/mutate-virtualmachines"
	PathMutateVMI           = "/mutate-virtualmachineinstances"
	PathValidateVM          = "/validate-virtualmachines"
	PathValidateVMI         = "/validate-virtualmachineinstances"
	PathMutateLauncherPods  = "/mutate-launcher-pods"
	PathMutateMigrationPods = "/mutate-migration-pods"
	// PathValidateVMIM checks the VirtualMachineInstanceMigrations of
	// decentralized migrations (MigrationValidator).
	PathValidateVMIM = "/validate-virtualmachineinstancemigrations"
	// PathMutateVMIMigrationStatus points a decentralized migration
	// source's virt-handler at kvnet's migration proxy (package proxy).
	PathMutateVMIMigrationStatus = "/mutate-vmi-migration-status"
)

// Handlers are the admission handlers kvnet serves, by path.
type Handlers map[string]admission.Handler

// Chains are the steps behind each path, in the order they run. The webhook
// serves what it is given; cmd/kvnet/app lists what kvnet runs (app.Chains).
type Chains struct {
	// VM runs on VirtualMachines and VirtualMachineInstances.
	VM []chain.VMMutator
	// VMValidators check what VM left, on the same objects.
	VMValidators []chain.VMValidator
	// LauncherPod runs on virt-launcher pods (CREATE and UPDATE).
	LauncherPod []chain.PodMutator
	// MigrationPod runs on virt-handler and synchronization-controller pods.
	MigrationPod []chain.PodMutator
	// MigrationValidators check the VirtualMachineInstanceMigrations of
	// decentralized migrations.
	MigrationValidators []chain.MigrationValidator
}

// NewHandlers builds every handler from one config source, one set of facts
// and the chains; the webhook server and the offline CLI both call it, so
// they run the same code.
func NewHandlers(cfg *config.Source, facts lookup.Facts, c Chains) Handlers {
	return Handlers{
		PathMutateVM:            &VMMutateHandler{Kind: chain.KindVM, Config: cfg, Facts: facts, Mutators: c.VM},
		PathMutateVMI:           &VMMutateHandler{Kind: chain.KindVMI, Config: cfg, Facts: facts, Mutators: c.VM},
		PathValidateVM:          &VMValidateHandler{Kind: chain.KindVM, Config: cfg, Facts: facts, Validators: c.VMValidators},
		PathValidateVMI:         &VMValidateHandler{Kind: chain.KindVMI, Config: cfg, Facts: facts, Validators: c.VMValidators},
		PathMutateLauncherPods:  &PodMutateHandler{Name: MetricMutateLauncherPod, Config: cfg, Facts: facts, Mutators: c.LauncherPod},
		PathMutateMigrationPods: &PodMutateHandler{Name: MetricMutateMigrationPod, Config: cfg, Facts: facts, Mutators: c.MigrationPod},
		PathValidateVMIM:        &MigrationValidateHandler{Config: cfg, Facts: facts, Validators: c.MigrationValidators},
	}
}

// Register mounts every handler on srv, each in an Edge.
func Register(srv ctrlwebhook.Server, hs Handlers) {
	for path, h := range hs {
		srv.Register(path, Webhook(h))
	}
}
