package config

import (
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

func TestValidateMigration(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want []string // field paths, in order
	}{
		"both networks": {yaml: `
migration:
  inCluster: {nad: kubevirt/m, pool: {cidr: 10.0.0.0/24, ranges: [10.0.0.10-10.0.0.20], exclude: [10.0.0.15]}}
  crossCluster: {nad: kubevirt/c, addresses: [10.0.1.10/24, 10.0.1.11/24], alsoInCluster: true}
`},
		"ipv6": {yaml: `
migration:
  inCluster: {nad: kubevirt/m, pool: {cidr: "fd00::/64", exclude: ["fd00::1"]}}
`},
		"missing fields": {yaml: `
migration:
  inCluster: {pool: {}}
  crossCluster: {}
`, want: []string{"migration.inCluster.nad", "migration.inCluster.pool.cidr", "migration.crossCluster.nad", "migration.crossCluster.addresses"}},
		"nad without namespace": {yaml: `
migration:
  inCluster: {nad: m, pool: {cidr: 10.0.0.0/24}}
`, want: []string{"migration.inCluster.nad"}},
		"bad range and exclusion entries": {yaml: `
migration:
  inCluster: {nad: kubevirt/m, pool: {cidr: 10.0.0.0/24, ranges: [10.0.0.1, 10.0.9.1]}}
`, want: []string{"migration.inCluster.pool.ranges[1]"}},
		"overlap": {yaml: `
migration:
  inCluster: {nad: kubevirt/m, pool: {cidr: 10.0.0.0/24}}
  crossCluster: {nad: kubevirt/c, addresses: [10.0.0.7/24]}
`, want: []string{"migration.crossCluster.addresses"}},
		"cross-cluster entry without prefix": {yaml: `
migration:
  crossCluster: {nad: kubevirt/c, addresses: [10.0.1.10/24, 10.0.1.11]}
`, want: []string{"migration.crossCluster.addresses[1]"}},
		"alsoInCluster without inCluster": {yaml: `
migration:
  crossCluster: {nad: kubevirt/c, addresses: [10.0.1.10/24], alsoInCluster: true}
`, want: []string{"migration.crossCluster.alsoInCluster"}},
		"interface too long, same NAD and interface twice": {yaml: `
migration:
  inCluster: {nad: kubevirt/m, interface: averyveryverylongname, pool: {cidr: 10.0.0.0/24}}
  crossCluster: {nad: kubevirt/m, interface: averyveryverylongname, addresses: [10.0.1.10/24]}
`, want: []string{"migration.inCluster.interface", "migration.crossCluster.interface", "migration.crossCluster.interface"}},
		"empty pool": {yaml: `
migration:
  inCluster: {nad: kubevirt/m, pool: {cidr: 10.0.0.0/30, exclude: [10.0.0.0/30]}}
`, want: []string{"migration.inCluster.pool"}},
		"proxy sidecar": {yaml: `
migration:
  inCluster: {nad: kubevirt/m, pool: {cidr: 10.0.0.0/24}}
  crossCluster: {nad: kubevirt/c, addresses: [10.0.1.10/24]}
  proxySidecar:
    enabled: true
    container: {name: kvnet-proxy, image: kvnet:1, volumeMounts: [{name: cert, mountPath: /etc/kvnet/proxy}]}
    volumes: [{name: cert, secret: {secretName: proxy-cert}}]
`},
		"proxy sidecar without networks, name, image; unknown and repeated volumes": {yaml: `
migration:
  proxySidecar:
    enabled: true
    container: {name: Bad_Name, volumeMounts: [{name: nope, mountPath: /x}]}
    volumes: [{name: a, emptyDir: {}}, {name: a, emptyDir: {}}]
`, want: []string{"migration.proxySidecar.enabled", "migration.proxySidecar.container.name", "migration.proxySidecar.container.image", "migration.proxySidecar.volumes[1].name", "migration.proxySidecar.container.volumeMounts[0].name"}},
		"proxy sidecar off needs neither networks nor a container": {yaml: `
migration:
  proxySidecar: {enabled: false}
`},
		"negative timeout": {yaml: `
migration:
  reservationTimeout: -1s
  crossCluster: {nad: kubevirt/c, addresses: [10.0.1.10/24]}
`, want: []string{"migration.reservationTimeout"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var c Config
			if err := yaml.UnmarshalStrict([]byte(tc.yaml), &c); err != nil {
				t.Fatal(err)
			}
			errs := Validate(&c)
			if got := migPaths(errs); !migEqual(got, tc.want) {
				t.Fatalf("fields = %v, want %v (%v)", got, tc.want, errs)
			}
		})
	}
}

func TestMigrationDefaults(t *testing.T) {
	c, err := Parse([]byte(`
migration:
  inCluster: {nad: kubevirt/m, pool: {cidr: 10.0.0.0/24}}
  crossCluster: {nad: kubevirt/c, addresses: [10.0.1.10/24]}
`), "kvnet")
	if err != nil {
		t.Fatal(err)
	}
	m := c.Migration
	if m.InCluster.Interface != "migration0" || m.CrossCluster.Interface != "crosscluster0" || m.Timeout() != 2*time.Minute {
		t.Fatalf("defaults: %q %q %s", m.InCluster.Interface, m.CrossCluster.Interface, m.Timeout())
	}
	if !m.InCluster.Selects(map[string]string{"kubevirt.io": "virt-handler"}) || m.InCluster.Selects(map[string]string{"kubevirt.io": "virt-launcher"}) {
		t.Fatal("in-cluster default selector")
	}
	if !m.CrossCluster.Selects(map[string]string{"kubevirt.io": "virt-synchronization-controller"}) {
		t.Fatal("cross-cluster default selector")
	}
}

func migPaths(errs field.ErrorList) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Field)
	}
	return out
}

func migEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The migration-networks guide's example parses, and the pool size its
// exhaustion message quotes is the one kvnet computes.
func TestDocumentedMigrationExample(t *testing.T) {
	b, err := os.ReadFile("../../docs/migration-networks.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	start := strings.Index(s, "<!-- migration-networks:begin -->")
	end := strings.Index(s, "<!-- migration-networks:end -->")
	if start < 0 || end < start {
		t.Fatal("docs/migration-networks.md has no migration-networks section")
	}
	sec := s[start:end]
	i := strings.Index(sec, "```yaml\n")
	j := strings.Index(sec[i+8:], "```")
	if i < 0 || j < 0 {
		t.Fatal("the section has no yaml example")
	}
	c, err := Parse([]byte(sec[i+8:i+8+j]), "kvnet")
	if err != nil {
		t.Fatalf("the example: %v", err)
	}
	if c.Migration.InCluster == nil || c.Migration.CrossCluster == nil {
		t.Fatal("the example must configure both networks")
	}
	p := c.Migration.InCluster.AddressPool()
	if want := "all " + p.Size().String() + " addresses"; !strings.Contains(sec, want) {
		t.Fatalf("the guide quotes another pool size than %q", want)
	}
}
