package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/persistentips"
)

// A VM whose persistent-IP network name has capitals gets kvnet's hashed
// claim name, which KubeVirt's ipam-extensions would not give it: the API
// server relays kvnet's warning saying so. A lowercase name gets none.
func TestClaimNameWarning(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "tenant", "", fmt.Sprintf(piPersistentConfig, "tenant-net", ns+"/tenant"))
	vm := func(name, network string) string {
		return `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: ` + name + `
spec:
  runStrategy: Halted
  template:
    spec:
      networks: [{name: ` + network + `, multus: {networkName: tenant}}]
      domain:
        devices: {interfaces: [{name: ` + network + `, bridge: {}}]}
        resources: {requests: {memory: 1Gi}}
`
	}
	c, warnings := warningClient(t)
	if _, err := createVM(t, c, ns, vm("caps", "Tenant")); err != nil {
		t.Fatal(err)
	}
	claim := persistentips.ClaimName("caps", "Tenant")
	if w := strings.Join(warnings.all(), "\n"); !strings.Contains(w, `IPAMClaim "`+claim+`": KubeVirt's ipam-extensions would name that claim differently`) {
		t.Errorf("warnings %q lack the claim-name warning for %s", w, claim)
	}

	c, warnings = warningClient(t)
	if _, err := createVM(t, c, ns, vm("plain", "tenant")); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(warnings.all(), "\n"); strings.Contains(w, "ipam-extensions") {
		t.Errorf("a lowercase network name was warned about: %q", w)
	}
}
