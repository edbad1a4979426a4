package validators_test

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/validators"
)

// vmim is a VMIM of namespace/name receiving (recv) and sending (send)
// the given migration IDs ("" for none), in phase.
func vmim(namespace, name, recv, send string, phase kubevirtv1.VirtualMachineInstanceMigrationPhase) kubevirtv1.VirtualMachineInstanceMigration {
	m := kubevirtv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"},
		Status:     kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: phase},
	}
	if recv != "" {
		m.Spec.Receive = &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: recv}
	}
	if send != "" {
		m.Spec.SendTo = &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: send, ConnectURL: "sync.cluster-b.example:9185"}
	}
	return m
}

func TestMigrationIDs(t *testing.T) {
	now := metav1.Now()
	deleting := vmim("victim", "deleting-in", "mig-deleting", "", kubevirtv1.MigrationRunning)
	deleting.DeletionTimestamp = &now
	cluster := []kubevirtv1.VirtualMachineInstanceMigration{
		vmim("victim", "vm1-in", "mig-victim", "", kubevirtv1.MigrationWaitingForSync),
		vmim("victim", "vm2-out", "", "mig-out", kubevirtv1.MigrationRunning),
		vmim("victim", "vm3-in", "mig-done", "", kubevirtv1.MigrationSucceeded),
		vmim("victim", "vm4-in", "mig-failed", "", kubevirtv1.MigrationFailed),
		vmim("other", "vm5-in", "mig-twice", "", kubevirtv1.MigrationPending),
		vmim("victim", "vm6-in", "mig-twice", "", kubevirtv1.MigrationPending),
		vmim("victim", "vm7", "mig-both", "mig-both", kubevirtv1.MigrationRunning),
		deleting,
	}
	recvPath, sendPath := migrationid.Receive.Path(), migrationid.Send.Path()
	used := func(p *field.Path, id, holders, role string) *field.Error {
		return field.Invalid(p, id, "already used by "+holders+
			": a migration ID names one "+role+" VirtualMachineInstanceMigration of the namespace until it has succeeded or failed")
	}
	for name, c := range map[string]struct {
		m    kubevirtv1.VirtualMachineInstanceMigration
		want field.ErrorList
	}{
		"in-cluster migration":                {m: vmim("tenant", "plain", "", "", "")},
		"a fresh receive ID":                  {m: vmim("tenant", "copy-in", "mig-new", "", "")},
		"a receive ID another namespace uses": {m: vmim("tenant", "copy-in", "mig-victim", "", "")},
		"a send ID another namespace uses":    {m: vmim("tenant", "copy-out", "", "mig-out", "")},
		"a receive ID of its own namespace":   {m: vmim("victim", "copy-in", "mig-twice", "", ""), want: field.ErrorList{used(recvPath, "mig-twice", "live migration vm6-in", "receiving")}},
		"a send ID of its own namespace":      {m: vmim("victim", "copy-out", "", "mig-out", ""), want: field.ErrorList{used(sendPath, "mig-out", "live migration vm2-out", "sending")}},
		"the other end, receive":              {m: vmim("tenant", "vm2-in", "mig-out", "", "")},
		"the other end, send":                 {m: vmim("tenant", "vm1-out", "", "mig-victim", "")},
		"both ends, both taken":               {m: vmim("victim", "both", "mig-both", "mig-both", ""), want: field.ErrorList{used(recvPath, "mig-both", "live migration vm7", "receiving"), used(sendPath, "mig-both", "live migration vm7", "sending")}},
		"both ends, taken elsewhere":          {m: vmim("tenant", "both", "mig-both", "mig-both", "")},
		"ID of a succeeded VMIM":              {m: vmim("tenant", "again-in", "mig-done", "", "")},
		"ID of a failed VMIM":                 {m: vmim("tenant", "again-in", "mig-failed", "", "")},
		"ID of a VMIM being gone":             {m: vmim("tenant", "again-in", "mig-deleting", "", "")},
		"itself":                              {m: vmim("victim", "vm1-in", "mig-victim", "", kubevirtv1.MigrationWaitingForSync)},
		"a final phase in the body":           {m: vmim("victim", "copy-in", "mig-victim", "", kubevirtv1.MigrationSucceeded), want: field.ErrorList{used(recvPath, "mig-victim", "live migration vm1-in", "receiving")}},
	} {
		t.Run(name, func(t *testing.T) {
			m := c.m
			req := &chain.MigrationRequest{Namespace: m.Namespace, Name: m.Name, Migration: &m, Config: defaultConfig, Facts: &lookup.Snapshot{Migrations: cluster}}
			got, err := validators.MigrationIDs{}.ValidateMigration(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !equality.Semantic.DeepEqual(got, c.want) {
				t.Errorf("errors:\n got %v\nwant %v", got, c.want)
			}
		})
	}
}

// holdersFailing is a cache that cannot answer.
type holdersFailing struct{ *lookup.Snapshot }

func (holdersFailing) MigrationHolders(context.Context, migrationid.Role, string) ([]types.NamespacedName, error) {
	return nil, errors.New("cache not synced")
}

// A lookup failure is kvnet's, not the user's: an error, no field error.
func TestMigrationIDsLookupFailure(t *testing.T) {
	m := vmim("tenant", "copy-in", "mig-victim", "", "")
	req := &chain.MigrationRequest{Namespace: m.Namespace, Name: m.Name, Migration: &m, Config: defaultConfig, Facts: holdersFailing{&lookup.Snapshot{}}}
	errs, err := validators.MigrationIDs{}.ValidateMigration(context.Background(), req)
	if err == nil || errs != nil {
		t.Fatalf("got errors %v and error %v, want only an error", errs, err)
	}
}
