package app

import (
	"context"
	"fmt"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/internal/model/peers"
)

// lastApplied is kubectl's copy of the whole object in an annotation: often
// the largest thing in a small object's metadata, and never read by kvnet.
const lastApplied = corev1.LastAppliedConfigAnnotation

// cacheOptions decides what the manager's informers keep of each object:
// only what kvnet reads, so that its memory follows the number of objects,
// not their size. What each cached kind is for, and what its trim keeps:
//
//   - NetworkAttachmentDefinition (lookup.Reader.NAD): metadata and
//     spec.config, that is all of it but managedFields.
//   - Namespace (lookup.Reader.NamespaceLabels): a metadata-only informer
//     (lookup.NamespaceMetadata); the API server sends only metadata.
//   - KubeVirt CR (validators, feature gates): all but managedFields.
//   - VirtualMachineInstance (mutators.ClaimRefs and PrimaryUDN, the
//     persistentips controller and its NAD index): metadata, spec.networks
//     and the interfaces (see networking); the rest of the domain, the
//     volumes and the status, most of a VMI's bytes, are dropped.
//   - VirtualMachine (the persistentips controller): metadata and the
//     template spec's networking.
//   - MutatingWebhookConfiguration (lookup.Reader.ResourceInjector and
//     MACPool, which recognise network-resources-injector and kubemacpool):
//     metadata and each webhook's name, rules, namespace and object
//     selectors and reinvocation policy; the client config,
//     CA bundle included, is dropped. kvnet's own configurations are read
//     from the API server where they are written (certs, the registrar).
//   - IPAMClaim, VirtualMachineInstanceMigration (the persistentips
//     controller, the launcher-pod mutators, lookup.Reader.IPAMClaim for
//     the primary-UDN validator, the migration-status rewrite): all but
//     managedFields.
//
// Nothing kvnet writes starts from a trimmed copy: it patches IPAMClaims
// (kept whole) and its own ConfigMaps (separate caches). Pods and Nodes are
// not in this cache at all: they have label-selected caches of their own
// (persistentips, migration). A new reader of a trimmed field must widen
// its trim here; TestCacheTrims lists what each keeps.
func cacheOptions() cache.Options {
	return cache.Options{
		DefaultTransform: trimMetadata,
		// A ByObject Transform replaces DefaultTransform for its kind, so each
		// also calls trimMetadata.
		ByObject: map[client.Object]cache.ByObject{
			&kubevirtv1.VirtualMachineInstance{}:           {Transform: trimVMI},
			&kubevirtv1.VirtualMachine{}:                   {Transform: trimVM},
			&admissionregv1.MutatingWebhookConfiguration{}: {Transform: trimWebhooks},
		},
	}
}

// trimMetadata drops managedFields and kubectl's last-applied copy of the
// object. Anything that is not an object (a tombstone) passes unchanged.
func trimMetadata(in any) (any, error) {
	o, ok := in.(client.Object)
	if !ok {
		return in, nil
	}
	o.SetManagedFields(nil)
	if a := o.GetAnnotations(); a[lastApplied] != "" {
		delete(a, lastApplied)
		o.SetAnnotations(a)
	}
	return in, nil
}

func trimVMI(in any) (any, error) {
	if vmi, ok := in.(*kubevirtv1.VirtualMachineInstance); ok {
		vmi.Spec = networking(&vmi.Spec)
		vmi.Status = kubevirtv1.VirtualMachineInstanceStatus{}
	}
	return trimMetadata(in)
}

func trimVM(in any) (any, error) {
	if vm, ok := in.(*kubevirtv1.VirtualMachine); ok {
		var tmpl *kubevirtv1.VirtualMachineInstanceTemplateSpec
		if vm.Spec.Template != nil {
			tmpl = &kubevirtv1.VirtualMachineInstanceTemplateSpec{
				Spec: networking(&vm.Spec.Template.Spec),
			}
		}
		vm.Spec = kubevirtv1.VirtualMachineSpec{Template: tmpl}
		vm.Status = kubevirtv1.VirtualMachineStatus{}
	}
	return trimMetadata(in)
}

func trimWebhooks(in any) (any, error) {
	if c, ok := in.(*admissionregv1.MutatingWebhookConfiguration); ok {
		for i, w := range c.Webhooks {
			c.Webhooks[i] = admissionregv1.MutatingWebhook{
				Name: w.Name, Rules: w.Rules, NamespaceSelector: w.NamespaceSelector, ObjectSelector: w.ObjectSelector,
				ReinvocationPolicy: w.ReinvocationPolicy,
			}
			if w.Name == peers.KubemacpoolVMWebhook {
				// kvnet calls it where the API server does not after
				// kvnet (mutators.MACPool): where, trusting what, for how
				// long, and whether a failure refuses the VM.
				c.Webhooks[i].ClientConfig = w.ClientConfig
				c.Webhooks[i].TimeoutSeconds = w.TimeoutSeconds
				c.Webhooks[i].FailurePolicy = w.FailurePolicy
			}
		}
	}
	return trimMetadata(in)
}

// networking is the part of a VMI spec kvnet reads from the cache: the
// networks, their interfaces (the pod network's MAC for a primary UDN) and
// whether the pod interface is attached when no network is listed
// (primaryudn.PodNetwork).
func networking(spec *kubevirtv1.VirtualMachineInstanceSpec) kubevirtv1.VirtualMachineInstanceSpec {
	var out kubevirtv1.VirtualMachineInstanceSpec
	out.Networks = spec.Networks
	out.Domain.Devices.Interfaces = spec.Domain.Devices.Interfaces
	out.Domain.Devices.AutoattachPodInterface = spec.Domain.Devices.AutoattachPodInterface
	return out
}

// indexMigrationIDs adds migrationid.IndexField to the VMIM informer of
// idx (a manager's field indexer, before the manager starts): the proxy's
// resolver and the migration-ids validator find the live holders of a
// migration ID through it, an index lookup per question instead of a copy
// of every VMIM of the cluster.
func indexMigrationIDs(ctx context.Context, idx client.FieldIndexer) error {
	err := idx.IndexField(ctx, &kubevirtv1.VirtualMachineInstanceMigration{}, migrationid.IndexField, func(o client.Object) []string {
		m, ok := o.(*kubevirtv1.VirtualMachineInstanceMigration)
		if !ok {
			return nil
		}
		return migrationid.Keys(m)
	})
	if err != nil {
		return fmt.Errorf("indexing VirtualMachineInstanceMigrations by migration ID: %w", err)
	}
	return nil
}

// indexMACs adds lookup.MACIndexField to the VirtualMachine informer of idx
// (before the manager starts): validators.MACsHeld finds the VMs holding a
// MAC through it.
func indexMACs(ctx context.Context, idx client.FieldIndexer) error {
	err := idx.IndexField(ctx, &kubevirtv1.VirtualMachine{}, lookup.MACIndexField, func(o client.Object) []string {
		vm, ok := o.(*kubevirtv1.VirtualMachine)
		if !ok {
			return nil
		}
		return lookup.InterfaceMACs(vm)
	})
	if err != nil {
		return fmt.Errorf("indexing VirtualMachines by interface MAC: %w", err)
	}
	return nil
}
