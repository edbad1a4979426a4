package test

import (
	"context"
	"fmt"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/test/framework"
	"github.com/kvnet/kvnet/webhook"
)

// The attack of issue 27, item 2, at admission, as issue 43 left it: a
// tenant with KubeVirt's edit rights in its own namespace copies a
// victim's migration ID into VMIMs of its own. Admission answers the
// tenant exactly as for an ID nobody uses, dry-run or not, so that it
// learns nothing of other namespaces; the copy is harmless because the
// proxy ties a migration to the VM's namespace and name (the two-cluster
// attacks are TestIdentityAttacksAcrossClusters). Within one namespace a
// second live VMIM of an ID is still refused, naming the first, and the ID
// is free again once virt-controller records that VMIM final. A route
// annotation that does not parse is refused with the field named.
func TestTenantCannotCopyAMigrationID(t *testing.T) {
	ctx := context.Background()
	victim, tenant := env.NewNamespace(t, nil), env.NewNamespace(t, nil)
	owner, ownerName := kubevirtEditor(t, victim)
	attacker, _ := kubevirtEditor(t, tenant)
	controller := virtControllerVMIMs(t, victim)
	id := "mig-" + victim // unique in the run: a VMIM outlives its namespace in envtest

	allowed := func() float64 {
		return metricValue(t, "kvnet_admission_requests_total", map[string]string{"webhook": webhook.MetricValidateMigration, "outcome": "allowed"})
	}
	beforeAllowed := allowed()
	in, out := decentralizedVMIM(victim, "vm1-in", id, ""), decentralizedVMIM(victim, "vm1-out", "", id)
	for _, m := range []*kubevirtv1.VirtualMachineInstanceMigration{in, out} {
		if err := owner.Create(ctx, m); err != nil {
			t.Fatalf("the victim's %s, one end of its migration %s: %v", m.Name, id, err)
		}
		env.WaitCached(t, &kubevirtv1.VirtualMachineInstanceMigration{}, client.ObjectKeyFromObject(m))
	}
	// An in-cluster migration (a node drain's) never reaches kvnet.
	if err := attacker.Create(ctx, decentralizedVMIM(tenant, "in-cluster", "", "")); err != nil {
		t.Fatalf("an in-cluster migration: %v", err)
	}
	if d := allowed() - beforeAllowed; d != 2 {
		t.Errorf("kvnet admitted %v VMIMs, want the victim's 2: an in-cluster migration is not sent", d)
	}
	// virt-controller has the receiving end wait for the synchronization
	// controller: in flight, still holding the ID.
	setVMIMPhase(t, controller, in, kubevirtv1.MigrationWaitingForSync)

	// The tenant: the victim's ID and a fresh one get the same answer.
	for i, c := range []struct{ what, recv, send string }{
		{"the victim's receiving ID", id, ""}, {"the victim's sending ID", "", id},
		{"a fresh receiving ID", id + "-fresh", ""}, {"a fresh sending ID", "", id + "-fresh"},
	} {
		m := decentralizedVMIM(tenant, fmt.Sprintf("copy-%d", i), c.recv, c.send)
		if err := attacker.Create(ctx, m.DeepCopy(), client.DryRunAll); err != nil {
			t.Errorf("the tenant's dry run with %s: %v, want admitted as any other", c.what, err)
		}
		if err := attacker.Create(ctx, m); err != nil {
			t.Errorf("the tenant's VMIM with %s: %v, want admitted as any other", c.what, err)
		}
	}

	denied := func() float64 {
		return metricValue(t, "kvnet_step_calls_total", map[string]string{"step": "migration-ids", "kind": string(chain.KindVMIM), "result": "denied"})
	}
	deniedLogs := func() int {
		return env.Logs.Count("denied", "webhook", webhook.MetricValidateMigration, "namespace", victim, "user", ownerName)
	}
	beforeSteps, beforeLogs := denied(), deniedLogs()
	twinIn, twinOut := decentralizedVMIM(victim, "twin-in", id, ""), decentralizedVMIM(victim, "twin-out", "", id)
	hasCause(t, owner.Create(ctx, twinIn.DeepCopy()), "spec.receive.migrationID", "already used by live migration vm1-in")
	hasCause(t, owner.Create(ctx, twinOut.DeepCopy()), "spec.sendTo.migrationID", "already used by live migration vm1-out")
	// A final phase written into the new VMIM's body changes nothing: the
	// API server drops it, and kvnet does not read it.
	ended := twinIn.DeepCopy()
	ended.Status.Phase = kubevirtv1.MigrationSucceeded
	hasCause(t, owner.Create(ctx, ended), "spec.receive.migrationID", "already used by live migration vm1-in")
	if d := denied() - beforeSteps; d != 3 {
		t.Errorf("kvnet_step_calls_total{step=migration-ids,result=denied} rose by %v, want 3", d)
	}
	if d := deniedLogs() - beforeLogs; d != 3 {
		t.Errorf("%d \"denied\" log lines name the second VMIMs, want 3", d)
	}

	// The victim's migration received: the receiving ID is free, the
	// sending one is still held.
	setVMIMPhase(t, controller, in, kubevirtv1.MigrationSucceeded)
	waitVMIMPhase(t, in, kubevirtv1.MigrationSucceeded)
	if err := owner.Create(ctx, twinIn.DeepCopy()); err != nil {
		t.Fatalf("a receiving VMIM with the ID of a migration that succeeded: %v", err)
	}
	hasCause(t, owner.Create(ctx, twinOut.DeepCopy()), "spec.sendTo.migrationID", "already used by live migration vm1-out")
	setVMIMPhase(t, controller, out, kubevirtv1.MigrationFailed)
	waitVMIMPhase(t, out, kubevirtv1.MigrationFailed)
	if err := owner.Create(ctx, twinOut.DeepCopy()); err != nil {
		t.Fatalf("a sending VMIM with the ID of a migration that failed: %v", err)
	}

	// The route annotations, each on its own end.
	moved := decentralizedVMIM(victim, "moved-out", "", id+"-moved")
	moved.Annotations = map[string]string{migrationid.AnnotationTarget: "team-a-prod"}
	hasCause(t, owner.Create(ctx, moved.DeepCopy()), "metadata.annotations[kvnet.io/migration-target]", "want <namespace>/<name>")
	moved.Annotations[migrationid.AnnotationTarget] = "team-a-prod/vm1"
	if err := owner.Create(ctx, moved); err != nil {
		t.Fatalf("a sending VMIM naming the VM that receives it: %v", err)
	}
	approving := decentralizedVMIM(victim, "moved-in", id+"-moved", "")
	approving.Annotations = map[string]string{migrationid.AnnotationSource: "team-a/vm1"}
	hasCause(t, owner.Create(ctx, approving.DeepCopy()), "metadata.annotations[kvnet.io/migration-source]", "want <peer>/<namespace>/<name>")
}

// decentralizedVMIM is a VMIM of ns/name that receives migration ID recv
// and sends migration ID send ("" for neither).
func decentralizedVMIM(ns, name, recv, send string) *kubevirtv1.VirtualMachineInstanceMigration {
	m := &kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"},
	}
	if recv != "" {
		m.Spec.Receive = &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: recv}
	}
	if send != "" {
		m.Spec.SendTo = &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: send, ConnectURL: "sync.cluster-b.example:9185"}
	}
	return m
}

// kubevirtEditor is a tenant user with what KubeVirt's kubevirt.io:edit
// ClusterRole grants on its core kinds, in ns only (a RoleBinding) and not
// on their status subresources; the test acts as that user by
// impersonation. It returns the client and the user's name.
func kubevirtEditor(t *testing.T, ns string) (client.Client, string) {
	t.Helper()
	name := "kubevirt-editor-" + ns
	mustCreate(t, env.Client, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubevirt-edit"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubevirt.io"},
			Resources: []string{"virtualmachines", "virtualmachineinstances", "virtualmachineinstancepresets", "virtualmachineinstancereplicasets", "virtualmachineinstancemigrations"},
			Verbs:     []string{"get", "delete", "create", "update", "patch", "list", "watch", "deletecollection"}}},
	})
	mustCreate(t, env.Client, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kubevirt-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kubevirt-edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: name}},
	})
	return impersonating(t, rest.ImpersonationConfig{UserName: name, Groups: []string{"system:authenticated"}}), name
}

// virtControllerVMIMs is virt-controller's identity (its ServiceAccount,
// impersonated) with its rights on VMIMs and their status in ns, for the
// status writes the test makes in its place.
func virtControllerVMIMs(t *testing.T, ns string) client.Client {
	t.Helper()
	const sa = "system:serviceaccount:kubevirt:kubevirt-controller"
	mustCreate(t, env.Client, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-controller-vmims"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"kubevirt.io"},
			Resources: []string{"virtualmachineinstancemigrations", "virtualmachineinstancemigrations/status"},
			Verbs:     []string{"get", "list", "watch", "update", "patch"}}},
	})
	mustCreate(t, env.Client, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "virt-controller-vmims"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "virt-controller-vmims"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "kubevirt", Name: "kubevirt-controller"}},
	})
	return impersonating(t, rest.ImpersonationConfig{UserName: sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kubevirt", "system:authenticated"}})
}

func impersonating(t *testing.T, who rest.ImpersonationConfig) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = who
	c, err := client.New(cfg, client.Options{Scheme: app.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// setVMIMPhase writes m's status.phase as virt-controller does, through
// the status subresource.
func setVMIMPhase(t *testing.T, c client.Client, m *kubevirtv1.VirtualMachineInstanceMigration, phase kubevirtv1.VirtualMachineInstanceMigrationPhase) {
	t.Helper()
	ctx := context.Background()
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	m.Status.Phase = phase
	if err := c.Status().Update(ctx, m); err != nil {
		t.Fatalf("virt-controller's phase %s on %s/%s: %v", phase, m.Namespace, m.Name, err)
	}
}

// waitVMIMPhase waits until kvnet's cache, which admission reads, has m
// in phase.
func waitVMIMPhase(t *testing.T, m *kubevirtv1.VirtualMachineInstanceMigration, phase kubevirtv1.VirtualMachineInstanceMigrationPhase) {
	t.Helper()
	framework.Eventually(t, fmt.Sprintf("%s/%s %s in kvnet's cache", m.Namespace, m.Name, phase), framework.CacheTimeout, func() error {
		var cur kubevirtv1.VirtualMachineInstanceMigration
		if err := env.Manager.GetCache().Get(context.Background(), client.ObjectKeyFromObject(m), &cur); err != nil {
			return err
		}
		if cur.Status.Phase != phase {
			return fmt.Errorf("phase %q", cur.Status.Phase)
		}
		return nil
	})
}
