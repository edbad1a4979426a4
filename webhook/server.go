// Package webhook is kvnet's admission edge: it turns AdmissionReviews into
// chain requests, chain results into one JSON patch or a field-error
// response, and registers the handlers on controller-runtime's webhook server.
package webhook

import (
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/validators"
)

// Paths kvnet serves. The chart and Configurations use the same constants.
const (
	PathMutateVM            = "/mutate-virtualmachines"
	PathMutateVMI           = "/mutate-virtualmachineinstances"
	PathValidateVM          = "/validate-virtualmachines"
	PathValidateVMI         = "/validate-virtualmachineinstances"
	PathMutateLauncherPods  = "/mutate-launcher-pods"
	PathMutateMigrationPods = "/mutate-migration-pods"
	// PathMutateVMIMigrationStatus points a decentralized migration
	// source's virt-handler at kvnet's migration proxy (package proxy).
	PathMutateVMIMigrationStatus = "/mutate-vmi-migration-status"
)

// Handlers are the admission handlers kvnet serves, by path.
type Handlers map[string]admission.Handler

// HandlerOptions carry the pod mutators the optional capabilities add.
type HandlerOptions struct {
	// LauncherPodMutators run on virt-launcher pods (CREATE and UPDATE).
	LauncherPodMutators []chain.PodMutator
	// MigrationPodMutators run on virt-handler and synchronization-controller pods.
	MigrationPodMutators []chain.PodMutator
}

// NewHandlers builds every handler from one config source and one set of
// facts; the webhook server and the offline CLI both call it, so they run the
// same code.
func NewHandlers(cfg *config.Source, facts lookup.Facts, o HandlerOptions) Handlers {
	h := Handlers{
		PathMutateVM:    &VMMutator{Kind: chain.KindVM, Config: cfg, Facts: facts, Mutators: mutators.Default()},
		PathMutateVMI:   &VMMutator{Kind: chain.KindVMI, Config: cfg, Facts: facts, Mutators: mutators.Default()},
		PathValidateVM:  &VMValidator{Kind: chain.KindVM, Config: cfg, Facts: facts, Validators: validators.Default()},
		PathValidateVMI: &VMValidator{Kind: chain.KindVMI, Config: cfg, Facts: facts, Validators: validators.Default()},
	}
	// NetworkResources last: it reads the Multus annotations as the others
	// leave them.
	launcher := append(append([]chain.PodMutator{mutators.KubeOVNPod{}, mutators.AddressesPod{}}, o.LauncherPodMutators...), mutators.NetworkResources{})
	h[PathMutateLauncherPods] = &PodMutator{Name: "launcher-pods", Config: cfg, Facts: facts, Mutators: launcher}
	h[PathMutateMigrationPods] = &PodMutator{Name: "migration-pods", Config: cfg, Facts: facts, Mutators: o.MigrationPodMutators}
	return h
}

// Register mounts every handler on srv, each in an Edge.
func Register(srv ctrlwebhook.Server, hs Handlers) {
	for path, h := range hs {
		srv.Register(path, Webhook(h))
	}
}
