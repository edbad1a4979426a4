package app

import (
	"testing"

	"github.com/kvnet/kvnet/internal/migration"
)

// Step names label kvnet_step_calls_total and name the step in logs and
// kvnet.io/mutations, so two steps sharing one would add their counts
// together: every step behind every webhook path has a name of its own.
// The chains are built as `kvnet webhook` builds them, every capability on.
func TestStepNamesAreUnique(t *testing.T) {
	c := Chains(Capabilities{
		PersistentIPs: persistentIPSteps(nil, nil),
		Migration:     migrationSteps(&migration.AddressMutator{}),
	})
	if n := len(c.LauncherPod); n != 6 {
		t.Errorf("%d launcher-pod steps with every capability on, want 6", n)
	}
	if n := len(c.MigrationPod); n != 2 {
		t.Errorf("%d migration-pod steps with every capability on, want 2", n)
	}
	var names []string
	for _, s := range c.VM {
		names = append(names, s.Name())
	}
	for _, s := range c.VMValidators {
		names = append(names, s.Name())
	}
	for _, s := range c.LauncherPod {
		names = append(names, s.Name())
	}
	for _, s := range c.MigrationPod {
		names = append(names, s.Name())
	}
	for _, s := range c.MigrationValidators {
		names = append(names, s.Name())
	}
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || seen[n] {
			t.Errorf("step name %q is empty or used twice (all: %v)", n, names)
		}
		seen[n] = true
	}
}
