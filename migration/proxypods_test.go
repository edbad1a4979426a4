package migration

import "testing"

// TestProxyPodsHoldCrossClusterAddresses: with the default selectors the
// kvnet migration proxy pods get crosscluster0 and (alsoInCluster)
// migration0, like a synchronization controller, and virt-handlers only
// migration0: the address count docs/migration-proxy.md states.
func TestProxyPodsHoldCrossClusterAddresses(t *testing.T) {
	c := mustConfig(t, bothNetworks)
	for _, tc := range []struct {
		label string
		want  int
	}{
		{"kvnet-migration-proxy", 2},
		{"virt-synchronization-controller", 2},
		{"virt-handler", 1},
	} {
		nets, err := Networks(&c.Migration, map[string]string{"kubevirt.io": tc.label})
		if err != nil {
			t.Fatal(err)
		}
		if len(nets) != tc.want {
			t.Errorf("%s pod gets %d migration networks %+v, want %d", tc.label, len(nets), nets, tc.want)
		}
		if tc.label == "virt-handler" && len(nets) == 1 && nets[0].Interface == "crosscluster0" {
			t.Errorf("a virt-handler got the cross-cluster network")
		}
	}
}
