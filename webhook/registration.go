package webhook

import (
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
)

// Registration describes how the API server reaches kvnet.
type Registration struct {
	// Name prefixes the configuration and webhook names; default "kvnet".
	Name string
	// ServiceNamespace/ServiceName/ServicePort locate the webhook Service.
	ServiceNamespace string
	ServiceName      string
	ServicePort      int32
	// CABundle verifies kvnet's serving certificate.
	CABundle []byte
	// ExcludedNamespaces are never sent to kvnet (kube-system and kvnet's own).
	ExcludedNamespaces []string
	// FailurePolicy applies to the VM/VMI webhooks; default Fail.
	FailurePolicy admissionregv1.FailurePolicyType
	// TimeoutSeconds per call; default 10.
	TimeoutSeconds int32
	// MigrationProxy adds the migration proxy's VMI status rewrite
	// (MigrationProxyWebhook) to the mutating configuration. Only with
	// `kvnet proxy` running: the rule holds every decentralized migration
	// until the proxy has published its relays.
	MigrationProxy bool
	// LauncherPods registers the virt-launcher pod webhook and MigrationPods
	// the virt-handler / synchronization-controller one. Both fail closed on
	// pods, so while kvnet is down they stop every pod they select: they are
	// registered only when a configured feature needs them (see For).
	LauncherPods, MigrationPods bool
	// MigrationNamespaces, when known from the config, are the only
	// namespaces the migration-pods webhook selects: those of the address
	// holders (KubeVirt's, and a separate proxy's). Unknown (nil: the
	// KubeVirt CR names KubeVirt's namespace) leaves the holder check to
	// admission alone.
	MigrationNamespaces []string
}

// For sets the pod webhooks the config needs: launcher pods for persistent
// IPs (the IPAMClaim reference), kube-ovn's legacy live migration or the
// network device resources (resources.inject not "never"), and migration
// pods only when a migration network is configured.
func (r Registration) For(c *config.Config) Registration {
	r.LauncherPods = c.PersistentIPsEnabled() || c.KubeOVN.LegacyLiveMigration || c.InjectResources()
	r.MigrationPods = c.Migration.Enabled()
	r.MigrationNamespaces = nil
	if r.MigrationPods {
		r.MigrationNamespaces = c.Migration.HolderNamespaces()
	}
	return r
}

// notDeleting keeps the updates of an object being deleted (finalizer
// removal) away from kvnet, as chain.SkipReason would allow them anyway: a
// kvnet outage must not leave objects stuck in Terminating.
var notDeleting = []admissionregv1.MatchCondition{{Name: "not-being-deleted", Expression: "!has(object.metadata.deletionTimestamp)"}}

// decentralized sends kvnet only the VMIMs of decentralized migrations, the
// ones with a migration ID: a node drain's migrations never wait on kvnet.
// CREATE only: virt-api refuses any change to a VMIM's spec.
var decentralized = []admissionregv1.MatchCondition{{Name: "decentralized-migration", Expression: "has(object.spec.receive) || has(object.spec.sendTo)"}}

// Labels KubeVirt puts on its pods, which the pod webhooks select on.
const (
	KubeVirtLabel            = kubevirtv1.AppLabel
	LauncherLabelValue       = "virt-launcher"
	HandlerLabelValue        = "virt-handler"
	SyncControllerLabelValue = "virt-synchronization-controller"
	// MigrationProxyLabelValue marks kvnet proxy pods, which need the same
	// migration addresses as the synchronization controller.
	MigrationProxyLabelValue = "kvnet-migration-proxy"
)

// Configurations returns the webhook configurations kvnet needs. The Helm
// chart renders the same rules; tests and the demo use these objects.
//
// It is long on purpose: it is a table, one literal per webhook, read top
// to bottom beside charts/kvnet/templates/webhooks.yaml, which test/chart
// compares with it; split into functions, the table would be scattered.
func (r Registration) Configurations() (*admissionregv1.MutatingWebhookConfiguration, *admissionregv1.ValidatingWebhookConfiguration) {
	name := r.Name
	if name == "" {
		name = "kvnet"
	}
	fail := r.FailurePolicy
	if fail == "" {
		fail = admissionregv1.Fail
	}
	timeout, excluded := r.timeout(), r.excluded()
	nsSel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: excluded,
	}}}
	client := func(path string) admissionregv1.WebhookClientConfig {
		return admissionregv1.WebhookClientConfig{
			Service:  &admissionregv1.ServiceReference{Namespace: r.ServiceNamespace, Name: r.ServiceName, Path: ptr.To(path), Port: ptr.To(r.ServicePort)},
			CABundle: r.CABundle,
		}
	}
	rule := func(group, resource string, ops ...admissionregv1.OperationType) []admissionregv1.RuleWithOperations {
		return []admissionregv1.RuleWithOperations{{
			Operations: ops,
			Rule: admissionregv1.Rule{
				APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource},
				Scope: ptr.To(admissionregv1.NamespacedScope),
			},
		}}
	}
	none := ptr.To(admissionregv1.SideEffectClassNone)
	ifNeeded := ptr.To(admissionregv1.IfNeededReinvocationPolicy)
	create, update := admissionregv1.Create, admissionregv1.Update
	mutating := &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregv1.MutatingWebhook{
			{
				Name: "virtualmachines.mutate.kvnet.io", ClientConfig: client(PathMutateVM),
				Rules: rule("kubevirt.io", "virtualmachines", create, update), NamespaceSelector: nsSel,
				FailurePolicy: &fail, SideEffects: none, TimeoutSeconds: &timeout, ReinvocationPolicy: ifNeeded,
				MatchConditions: notDeleting, AdmissionReviewVersions: []string{"v1"},
			},
			{
				Name: "virtualmachineinstances.mutate.kvnet.io", ClientConfig: client(PathMutateVMI),
				Rules: rule("kubevirt.io", "virtualmachineinstances", create), NamespaceSelector: nsSel,
				FailurePolicy: &fail, SideEffects: none, TimeoutSeconds: &timeout, ReinvocationPolicy: ifNeeded,
				AdmissionReviewVersions: []string{"v1"},
			},
		},
	}
	if r.LauncherPods {
		mutating.Webhooks = append(mutating.Webhooks, admissionregv1.MutatingWebhook{
			Name: "launcher-pods.mutate.kvnet.io", ClientConfig: client(PathMutateLauncherPods),
			Rules: rule("", "pods", create, update), NamespaceSelector: nsSel,
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{KubeVirtLabel: LauncherLabelValue}},
			FailurePolicy:  &fail, SideEffects: ptr.To(admissionregv1.SideEffectClassNoneOnDryRun), TimeoutSeconds: &timeout,
			ReinvocationPolicy: ifNeeded, MatchConditions: notDeleting, AdmissionReviewVersions: []string{"v1"},
		})
	}
	if r.MigrationPods {
		migNS := nsSel
		if r.MigrationNamespaces != nil {
			migNS = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpIn, Values: r.MigrationNamespaces,
			}}}
		}
		mutating.Webhooks = append(mutating.Webhooks, admissionregv1.MutatingWebhook{
			Name: "migration-pods.mutate.kvnet.io", ClientConfig: client(PathMutateMigrationPods),
			Rules: rule("", "pods", create),
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: KubeVirtLabel, Operator: metav1.LabelSelectorOpIn, Values: []string{HandlerLabelValue, SyncControllerLabelValue, MigrationProxyLabelValue},
			}}},
			NamespaceSelector: migNS,
			FailurePolicy:     &fail, SideEffects: ptr.To(admissionregv1.SideEffectClassNoneOnDryRun), TimeoutSeconds: &timeout,
			ReinvocationPolicy: ifNeeded, AdmissionReviewVersions: []string{"v1"},
		})
	}
	if r.MigrationProxy {
		mutating.Webhooks = append(mutating.Webhooks, r.MigrationProxyWebhook())
	}
	validating := &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregv1.ValidatingWebhook{
			{
				Name: "virtualmachines.validate.kvnet.io", ClientConfig: client(PathValidateVM),
				Rules: rule("kubevirt.io", "virtualmachines", create, update), NamespaceSelector: nsSel,
				FailurePolicy: &fail, SideEffects: none, TimeoutSeconds: &timeout,
				MatchConditions: notDeleting, AdmissionReviewVersions: []string{"v1"},
			},
			{
				Name: "virtualmachineinstances.validate.kvnet.io", ClientConfig: client(PathValidateVMI),
				Rules: rule("kubevirt.io", "virtualmachineinstances", create), NamespaceSelector: nsSel,
				FailurePolicy: &fail, SideEffects: none, TimeoutSeconds: &timeout,
				AdmissionReviewVersions: []string{"v1"},
			},
			{
				Name: "virtualmachineinstancemigrations.validate.kvnet.io", ClientConfig: client(PathValidateVMIM),
				Rules: rule("kubevirt.io", "virtualmachineinstancemigrations", create), NamespaceSelector: nsSel,
				MatchConditions: decentralized,
				FailurePolicy:   &fail, SideEffects: none, TimeoutSeconds: &timeout,
				AdmissionReviewVersions: []string{"v1"},
			},
		},
	}
	return mutating, validating
}

// MigrationProxyWebhook is the rule of kvnet's migration proxy (package
// proxy): UPDATEs of VMIs that carry status.migrationState.targetState, so
// that the source virt-handler of a decentralized migration dials the proxy.
// Configurations includes it when r.MigrationProxy is set, as the chart does
// with migrationProxy.enabled. Its failure policy is always Fail, whatever
// r.FailurePolicy says: an outage must hold the migration rather than let the
// remote node address, unreachable from the source, through.
func (r Registration) MigrationProxyWebhook() admissionregv1.MutatingWebhook {
	timeout, excluded := r.timeout(), r.excluded()
	return admissionregv1.MutatingWebhook{
		Name: "vmi-migration-status.mutate.kvnet.io",
		ClientConfig: admissionregv1.WebhookClientConfig{
			Service:  &admissionregv1.ServiceReference{Namespace: r.ServiceNamespace, Name: r.ServiceName, Path: ptr.To(PathMutateVMIMigrationStatus), Port: ptr.To(r.ServicePort)},
			CABundle: r.CABundle,
		},
		Rules: []admissionregv1.RuleWithOperations{{
			Operations: []admissionregv1.OperationType{admissionregv1.Update},
			Rule: admissionregv1.Rule{
				APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachineinstances"},
				Scope: ptr.To(admissionregv1.NamespacedScope),
			},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: excluded,
		}}},
		// Only writes of a migration in flight reach kvnet: a targetState,
		// and not yet completed or failed (migrationState stays on the VMI
		// after the migration). Most VMI status updates never leave the API
		// server.
		MatchConditions: []admissionregv1.MatchCondition{{
			Name: "migration-in-flight",
			Expression: "has(object.status) && has(object.status.migrationState) && has(object.status.migrationState.targetState)" +
				" && !(has(object.status.migrationState.completed) && object.status.migrationState.completed == true)" +
				" && !(has(object.status.migrationState.failed) && object.status.migrationState.failed == true)",
		}},
		FailurePolicy:           ptr.To(admissionregv1.Fail),
		SideEffects:             ptr.To(admissionregv1.SideEffectClassNone),
		TimeoutSeconds:          &timeout,
		ReinvocationPolicy:      ptr.To(admissionregv1.IfNeededReinvocationPolicy),
		AdmissionReviewVersions: []string{"v1"},
	}
}

// timeout is TimeoutSeconds, default 10.
func (r Registration) timeout() int32 {
	if r.TimeoutSeconds == 0 {
		return 10
	}
	return r.TimeoutSeconds
}

// excluded is ExcludedNamespaces, default kube-system.
func (r Registration) excluded() []string {
	if len(r.ExcludedNamespaces) == 0 {
		return []string{"kube-system"}
	}
	return r.ExcludedNamespaces
}
