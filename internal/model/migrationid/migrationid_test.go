package migrationid_test

import (
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/model/migrationid"
)

func TestKeys(t *testing.T) {
	receive := &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: "m1"}
	send := &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: "m1", ConnectURL: "sync.example:9185"}
	now := metav1.Now()
	for name, c := range map[string]struct {
		spec    kubevirtv1.VirtualMachineInstanceMigrationSpec
		phase   kubevirtv1.VirtualMachineInstanceMigrationPhase
		deleted bool
		want    []string
	}{
		"in-cluster migration":     {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}},
		"receiving, new":           {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{Receive: receive}, want: []string{"receive/m1"}},
		"sending, running":         {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{SendTo: send}, phase: kubevirtv1.MigrationRunning, want: []string{"sendTo/m1"}},
		"both ends":                {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{Receive: receive, SendTo: send}, want: []string{"receive/m1", "sendTo/m1"}},
		"empty ID":                 {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{}}},
		"succeeded":                {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{Receive: receive}, phase: kubevirtv1.MigrationSucceeded},
		"failed":                   {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{SendTo: send}, phase: kubevirtv1.MigrationFailed},
		"being deleted":            {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{Receive: receive}, phase: kubevirtv1.MigrationRunning, deleted: true},
		"waiting for the sync ctl": {spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{Receive: receive}, phase: kubevirtv1.MigrationWaitingForSync, want: []string{"receive/m1"}},
	} {
		t.Run(name, func(t *testing.T) {
			m := &kubevirtv1.VirtualMachineInstanceMigration{Spec: c.spec, Status: kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: c.phase}}
			if c.deleted {
				m.DeletionTimestamp = &now
			}
			if got := migrationid.Keys(m); !slices.Equal(got, c.want) {
				t.Errorf("Keys = %q, want %q", got, c.want)
			}
		})
	}
}

func TestRolePaths(t *testing.T) {
	for r, want := range map[migrationid.Role]string{migrationid.Receive: "spec.receive.migrationID", migrationid.Send: "spec.sendTo.migrationID"} {
		if got := r.Path().String(); got != want {
			t.Errorf("%s: path %s, want %s", r, got, want)
		}
	}
}
