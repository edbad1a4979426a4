package app

import (
	"testing"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/mutators"
)

// Step names label kvnet_step_calls_total and name the step in logs and
// kvnet.io/mutations, so two steps sharing one would add their counts
// together (the vDPA mutator and validator once did): every step behind
// every webhook path has a name of its own.
func TestStepNamesAreUnique(t *testing.T) {
	c := Chains(Extensions{
		LauncherPod:  []chain.PodMutator{mutators.ClaimRefs{}, mutators.PrimaryUDNPod{}},
		MigrationPod: []chain.PodMutator{&migration.AddressMutator{}, migration.Sidecar{}},
	})
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
