package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// KubemacpoolVersion is the kubemacpool build make peers unpacks
// (../shared/peers/README.md).
const KubemacpoolVersion = "v0.51.1"

// kubemacpool as its config/release/kubemacpool.yaml deploys it at
// KubemacpoolVersion.
const (
	KubemacpoolNamespace      = "kubemacpool-system"
	KubemacpoolServiceAccount = "kubemacpool-sa"
	// KubemacpoolConfiguration is its MutatingWebhookConfiguration. It
	// cannot be renamed: kubemacpool reads it by this name
	// (pkg/names MUTATE_WEBHOOK_CONFIG) to learn which namespaces it
	// manages, and does not start without it.
	KubemacpoolConfiguration = "kubemacpool-mutator"
	// KubemacpoolVMWebhook and KubemacpoolPodWebhook are its two webhooks.
	KubemacpoolVMWebhook  = "mutatevirtualmachines.kubemacpool.io"
	KubemacpoolPodWebhook = "mutatepods.kubemacpool.io"
	// KubemacpoolRangeConfigMap holds its MAC range, which the
	// Deployment hands it as RANGE_START and RANGE_END.
	KubemacpoolRangeConfigMap = "kubemacpool-mac-range-config"
	// KubemacpoolRangeStart and KubemacpoolRangeEnd are the range it
	// ships.
	KubemacpoolRangeStart = "02:00:00:00:00:00"
	KubemacpoolRangeEnd   = "02:FF:FF:FF:FF:FF"
	// kubemacpoolWebhookPort is where its webhook server always listens
	// (pkg/webhook WebhookServerPort; no flag).
	kubemacpoolWebhookPort = 8000
)

// Kubemacpool is kubemacpool's mac-controller-manager (its VM and pod
// webhooks, its VM, pod and collision controllers) running against a test
// control plane.
type Kubemacpool struct {
	client   client.Client
	proc     *process
	port     *os.File // holds the lock of kubemacpoolWebhookPort while it runs
	argv     []string
	env      []string
	readyURL string
	// LogPath is the process's log.
	LogPath string
}

// StartKubemacpool runs kubemacpool as its mac-controller-manager
// Deployment does (config/release/kubemacpool.yaml): under its own
// ServiceAccount with its ClusterRole, with --v=production and
// --wait-time=300, POD_NAMESPACE, POD_NAME, RANGE_START and RANGE_END from
// its range ConfigMap, TLS_MIN_VERSION VersionTLS13 and
// KUBEVIRT_CLIENT_GO_SCHEME_REGISTRATION_VERSION v1, and its
// MutatingWebhookConfiguration as shipped (both webhooks, failurePolicy
// Fail, the API server's default reinvocationPolicy Never, the VM webhook
// opt-out and the pod webhook opt-in by namespace label), registered by
// URL. What differs, each because the process is not in a pod: its
// serving certificate is issued here for 127.0.0.1 (in a cluster its own
// cert-manager Deployment, RUN_CERT_MANAGER, issues one for its Service
// and writes its CA into the configuration), found where
// controller-runtime looks, under TMPDIR; its metrics listen on a free
// loopback port instead of :8443; its kubeconfig holds a token of its
// ServiceAccount. dir receives the certificates, kubeconfig and log. A
// missing binary is an error naming make peers.
func StartKubemacpool(ctx context.Context, cfg *rest.Config, c client.Client, dir string) (_ *Kubemacpool, err error) {
	bin := filepath.Join(PeersDir(), "kubemacpool")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("kubemacpool (%s) not found at %s: run `make peers` (hack/peers.sh unpacks it from ../shared/peers)", KubemacpoolVersion, bin)
	}
	lock, err := claimFixedPort(ctx, kubemacpoolWebhookPort, "kubemacpool's")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, o := range kubemacpoolObjects() {
		if err := createIfAbsent(ctx, c, o); err != nil {
			return nil, err
		}
	}
	var ranges corev1.ConfigMap
	if err := c.Get(ctx, client.ObjectKey{Namespace: KubemacpoolNamespace, Name: KubemacpoolRangeConfigMap}, &ranges); err != nil {
		return nil, fmt.Errorf("kubemacpool's range ConfigMap: %w", err)
	}
	kubeconfig, err := serviceAccountKubeconfig(ctx, cfg, KubemacpoolNamespace, KubemacpoolServiceAccount, dir)
	if err != nil {
		return nil, err
	}
	ca, serving, err := loopbackServing("kubemacpool-test-ca", "kubemacpool-service")
	if err != nil {
		return nil, err
	}
	// controller-runtime's webhook server reads
	// $TMPDIR/k8s-webhook-server/serving-certs/tls.{crt,key}, where the
	// Deployment mounts its Secret.
	tmp := filepath.Join(dir, "tmp")
	if _, _, err := serving.write(filepath.Join(tmp, "k8s-webhook-server", "serving-certs"), "tls"); err != nil {
		return nil, err
	}
	metrics, err := freePort()
	if err != nil {
		return nil, err
	}
	k := &Kubemacpool{
		client: c, port: lock, LogPath: filepath.Join(dir, "kubemacpool.log"),
		argv: []string{bin, "--v=production", "--wait-time=300", "--metrics-addr=127.0.0.1:" + strconv.Itoa(metrics)},
		env: []string{
			"KUBECONFIG=" + kubeconfig, "TMPDIR=" + tmp,
			"POD_NAMESPACE=" + KubemacpoolNamespace, "POD_NAME=kubemacpool-mac-controller-manager-0",
			"RANGE_START=" + ranges.Data["RANGE_START"], "RANGE_END=" + ranges.Data["RANGE_END"],
			"KUBEVIRT_CLIENT_GO_SCHEME_REGISTRATION_VERSION=v1", "TLS_MIN_VERSION=VersionTLS13",
		},
		readyURL: fmt.Sprintf("https://127.0.0.1:%d/readyz", kubemacpoolWebhookPort),
	}
	// kubemacpool reads its own configuration at start (which namespaces
	// it manages), so it is registered first; failurePolicy Fail holds VM
	// creates until the process answers.
	if err := c.Create(ctx, kubemacpoolWebhookConfiguration(ca.certPEM)); err != nil {
		return nil, fmt.Errorf("registering kubemacpool's webhooks: %w", err)
	}
	defer func() {
		if err != nil {
			_ = c.Delete(context.Background(), &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: KubemacpoolConfiguration}})
		}
	}()
	if err := k.start(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// start runs the process and waits for its /readyz (the pool manager has
// read every VM's MACs), on the webhook port, as the Deployment's
// readiness probe does.
func (k *Kubemacpool) start(ctx context.Context) error {
	var err error
	if k.proc, err = startProcess("kubemacpool", k.argv, k.LogPath, k.env); err != nil {
		return err
	}
	if err := k.proc.waitReady(ctx, k.readyURL, 90*time.Second); err != nil {
		k.proc.stop()
		return fmt.Errorf("kubemacpool: %w; its log:\n%s", err, k.proc.tail(40))
	}
	return nil
}

// Restart kills the process and starts it again, as a rescheduled pod
// would be: it rebuilds its pool from the VMs in the cluster.
func (k *Kubemacpool) Restart(ctx context.Context) error {
	k.proc.stop()
	return k.start(ctx)
}

// Stop removes its webhook configuration first (it fails closed on VMs),
// then ends the process.
func (k *Kubemacpool) Stop() {
	_ = k.client.Delete(context.Background(), &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: KubemacpoolConfiguration}})
	k.proc.stop()
	k.port.Close()
}

// Tail is the last lines of its log, for a failed test.
func (k *Kubemacpool) Tail(lines int) string { return k.proc.tail(lines) }

// kubemacpoolWebhookConfiguration is the release's
// MutatingWebhookConfiguration, pointed at the process by URL.
func kubemacpoolWebhookConfiguration(caPEM []byte) *admissionregv1.MutatingWebhookConfiguration {
	url := func(path string) *string {
		return ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", kubemacpoolWebhookPort, path))
	}
	runlevel := []metav1.LabelSelectorRequirement{
		{Key: "runlevel", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"0", "1"}},
		{Key: "openshift.io/run-level", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"0", "1"}},
	}
	webhook := func(name, path string, opt metav1.LabelSelectorRequirement, rule admissionregv1.RuleWithOperations) admissionregv1.MutatingWebhook {
		return admissionregv1.MutatingWebhook{
			Name:                    name,
			AdmissionReviewVersions: []string{"v1", "v1beta1"},
			ClientConfig:            admissionregv1.WebhookClientConfig{URL: url(path), CABundle: caPEM},
			FailurePolicy:           ptr.To(admissionregv1.Fail),
			SideEffects:             ptr.To(admissionregv1.SideEffectClassNoneOnDryRun),
			NamespaceSelector:       &metav1.LabelSelector{MatchExpressions: append(append([]metav1.LabelSelectorRequirement{}, runlevel...), opt)},
			Rules:                   []admissionregv1.RuleWithOperations{rule},
		}
	}
	return &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: KubemacpoolConfiguration},
		Webhooks: []admissionregv1.MutatingWebhook{
			webhook(KubemacpoolPodWebhook, "/mutate-pods",
				metav1.LabelSelectorRequirement{Key: KubemacpoolPodWebhook, Operator: metav1.LabelSelectorOpIn, Values: []string{"allocate"}},
				admissionregv1.RuleWithOperations{
					Operations: []admissionregv1.OperationType{admissionregv1.Create},
					Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				}),
			webhook(KubemacpoolVMWebhook, "/mutate-virtualmachines",
				metav1.LabelSelectorRequirement{Key: KubemacpoolVMWebhook, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"ignore"}},
				admissionregv1.RuleWithOperations{
					Operations: []admissionregv1.OperationType{admissionregv1.Create, admissionregv1.Update},
					Rule:       admissionregv1.Rule{APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"}, Resources: []string{"virtualmachines"}},
				}),
		},
	}
}

// kubemacpoolObjects are the release's Namespace, ServiceAccount,
// ClusterRole and binding, and range ConfigMap.
func kubemacpoolObjects() []client.Object {
	rule := func(group string, resources []string, verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{group}, Resources: resources, Verbs: verbs}
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "kubemacpool-manager-role"},
		Rules: []rbacv1.PolicyRule{
			rule("admissionregistration.k8s.io", []string{"validatingwebhookconfigurations"}, "list", "watch"),
			rule("admissionregistration.k8s.io", []string{"mutatingwebhookconfigurations"}, "get", "list", "update", "watch"),
			rule("", []string{"secrets"}, "list", "watch", "create", "update"),
			rule("apiextensions.k8s.io", []string{"customresourcedefinitions"}, "get"),
			rule("", []string{"pods"}, "get", "list", "watch"),
			rule("", []string{"namespaces"}, "get", "list", "watch"),
			rule("kubevirt.io", []string{"virtualmachines"}, "get", "list", "watch", "update"),
			rule("kubevirt.io", []string{"virtualmachineinstances"}, "get", "list", "watch"),
			rule("", []string{"configmaps"}, "get", "delete", "list", "watch"),
			rule("authentication.k8s.io", []string{"tokenreviews"}, "create"),
			rule("authorization.k8s.io", []string{"subjectaccessreviews"}, "create"),
			rule("", []string{"events"}, "create", "patch"),
		},
	}
	return []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: KubemacpoolNamespace, Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: KubemacpoolNamespace, Name: KubemacpoolServiceAccount}},
		role,
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubemacpool-manager-rolebinding"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: KubemacpoolNamespace, Name: KubemacpoolServiceAccount}},
		},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: KubemacpoolNamespace, Name: KubemacpoolRangeConfigMap,
				Labels: map[string]string{"control-plane": "mac-controller-manager", "controller-tools.k8s.io": "1.0"}},
			Data: map[string]string{"RANGE_START": KubemacpoolRangeStart, "RANGE_END": KubemacpoolRangeEnd},
		},
	}
}
