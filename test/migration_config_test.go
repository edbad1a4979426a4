package test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/test/migholders"
)

// The config is checked against the cluster: a missing NAD is an error
// naming the field; too few cross-cluster addresses for the holder replicas
// an error; exactly as many a warning (no spare for a surge).
func TestMigrationConfigCheckedAgainstCluster(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "crosscluster", "", fmt.Sprintf(bridgeConfig, "crosscluster"))
	migholders.SyncReplicaSet(t, env.Client, ns, 2)
	cfg, err := env.SetConfig(fmt.Sprintf(`
migration:
  namespace: %[1]s
  inCluster:
    nad: %[1]s/missing
    pool: {cidr: 10.95.0.0/24}
  crossCluster:
    nad: %[1]s/crosscluster
    addresses: [10.95.1.10/24, 10.95.1.11/24]
`, ns))
	if err != nil {
		t.Fatal(err)
	}
	defer cfg()
	m := env.Source.Get().Migration
	errs, warnings, err := migration.CheckCluster(context.Background(), env.Client, &m)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 1 || errs[0].Field != "migration.inCluster.nad" {
		t.Fatalf("errors = %v, want the missing NAD at migration.inCluster.nad", errs)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "2 addresses for 2 holder replicas leave none spare") {
		t.Fatalf("warnings = %v, want no-spare", warnings)
	}
	m.CrossCluster.Addresses = m.CrossCluster.Addresses[:1]
	errs, _, err = migration.CheckCluster(context.Background(), env.Client, &m)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != 2 || errs[1].Field != "migration.crossCluster.addresses" {
		t.Fatalf("errors = %v, want too few cross-cluster addresses", errs)
	}
	// A virt-handler admitted while the NAD is missing is denied, naming the field.
	ds := migholders.HandlerDaemonSet(t, env.Client, ns)
	err = env.Client.Create(context.Background(), migholders.HandlerPod(ds, "mig-nad-1", nil))
	if err == nil || !strings.Contains(err.Error(), "migration.inCluster.nad: NetworkAttachmentDefinition "+ns+"/missing does not exist") {
		t.Fatalf("want a denial naming migration.inCluster.nad, got %v", err)
	}
}
