package validators_test

import (
	"context"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/chain/chaintest"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/lookup/lookuptest"
	"github.com/kvnet/kvnet/validators"
)

const ns = "tenant-a"

var nadInfo = lookuptest.NAD

func testFacts(kv *kubevirtv1.KubeVirt) *lookup.Snapshot {
	s := lookuptest.Facts(
		nadInfo(ns, "br", "", `{"cniVersion":"0.4.0","name":"br","type":"bridge"}`),
		nadInfo(ns, "vf", "intel.com/sriov_netdevice", `{"cniVersion":"0.4.0","name":"vf","type":"sriov"}`),
		nadInfo(ns, "vd", "jaguarmicro.com/jaguar", `{"cniVersion":"0.4.0","name":"vd","type":"sriov"}`),
		nadInfo(ns, "ovn", "", `{"cniVersion":"0.3.0","type":"kube-ovn"}`),
		nadInfo(ns, "broken", "", `{"cniVersion":`),
	)
	s.KubeVirtCR = kv
	return s
}

func kubeVirt(binding string) *kubevirtv1.KubeVirt {
	kv := &kubevirtv1.KubeVirt{ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt", Name: "kubevirt"}}
	if binding != "" {
		if err := yaml.UnmarshalStrict([]byte(binding), &kv.Spec.Configuration); err != nil {
			panic(err)
		}
	}
	return kv
}

var defaultConfig = func() *config.Config {
	c, err := config.Parse([]byte("vdpa: {bindingPlugin: vdpa}"), "")
	if err != nil {
		panic(err)
	}
	return c
}()

// vmRequest builds the chain request the webhook builds for a VM (or, with
// vmi, for a standalone VMI whose spec is the same).
func vmRequest(t testing.TB, specYAML string, vmi bool) *chain.Request {
	t.Helper()
	req := chaintest.Template(t, specYAML, ns, vmi)
	req.Config = defaultConfig
	return req
}

type fieldErr struct {
	Type  field.ErrorType
	Field string
}

func errorTypes(errs field.ErrorList) []fieldErr {
	var out []fieldErr
	for _, e := range errs {
		out = append(out, fieldErr{e.Type, e.Field})
	}
	return out
}

type vcase struct {
	spec         string
	vmi          bool
	kv           *kubevirtv1.KubeVirt
	want         []fieldErr
	wantWarnings int
}

func runCases(t *testing.T, v chain.VMValidator, cases map[string]vcase) {
	t.Helper()
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			req := vmRequest(t, c.spec, c.vmi)
			req.Facts = testFacts(c.kv)
			errs, err := v.Validate(context.Background(), req)
			if err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if got := errorTypes(errs); !reflect.DeepEqual(got, c.want) {
				t.Errorf("errors = %v\nwant %v\n(%v)", got, c.want, errs)
			}
			if len(req.Warnings) != c.wantWarnings {
				t.Errorf("warnings = %q, want %d", req.Warnings, c.wantWarnings)
			}
		})
	}
}

const tspec = "spec.template.spec."

func TestTopology(t *testing.T) {
	runCases(t, validators.Topology{}, map[string]vcase{
		"pairs": {spec: `
spec:
  domain: {devices: {interfaces: [{name: default, masquerade: {}}, {name: a, bridge: {}}]}}
  networks: [{name: default, pod: {}}, {name: a, multus: {networkName: br}}]`},
		"network without interface": {spec: `
spec:
  domain: {devices: {interfaces: [{name: default, masquerade: {}}]}}
  networks: [{name: default, pod: {}}, {name: a, multus: {networkName: br}}]`,
			want: []fieldErr{{field.ErrorTypeRequired, tspec + "domain.devices.interfaces"}}},
		"interface without network": {spec: `
spec:
  domain: {devices: {interfaces: [{name: default, masquerade: {}}, {name: orphan, bridge: {}}]}}
  networks: [{name: default, pod: {}}]`,
			want: []fieldErr{{field.ErrorTypeInvalid, tspec + "domain.devices.interfaces[1].name"}}},
		"duplicates": {spec: `
spec:
  domain: {devices: {interfaces: [{name: a, bridge: {}}, {name: a, bridge: {}}]}}
  networks: [{name: a, multus: {networkName: br}}, {name: a, multus: {networkName: br}}]`,
			want: []fieldErr{
				{field.ErrorTypeDuplicate, tspec + "networks[1].name"},
				{field.ErrorTypeDuplicate, tspec + "domain.devices.interfaces[1].name"},
			}},
		"VMI paths": {vmi: true, spec: `
spec:
  domain: {devices: {interfaces: [{name: orphan, bridge: {}}]}}`,
			want: []fieldErr{{field.ErrorTypeInvalid, "spec.domain.devices.interfaces[0].name"}}},
	})
}

func TestNADs(t *testing.T) {
	runCases(t, validators.NADs{}, map[string]vcase{
		"existing NADs, short and qualified": {spec: `
spec:
  networks: [{name: default, pod: {}}, {name: a, multus: {networkName: br}}, {name: b, multus: {networkName: tenant-a/vf}}]`},
		"not found": {spec: `
spec:
  networks: [{name: a, multus: {networkName: br}}, {name: b, multus: {networkName: other/br}}]`,
			want: []fieldErr{{field.ErrorTypeNotFound, tspec + "networks[1].multus.networkName"}}},
		"malformed reference": {spec: `
spec:
  networks: [{name: a, multus: {networkName: 'a/b/c'}}, {name: b, multus: {networkName: 'Upper'}}]`,
			want: []fieldErr{
				{field.ErrorTypeInvalid, tspec + "networks[0].multus.networkName"},
				{field.ErrorTypeInvalid, tspec + "networks[1].multus.networkName"},
			}},
		"unparsable spec.config": {spec: `
spec:
  networks: [{name: a, multus: {networkName: broken}}]`,
			want: []fieldErr{{field.ErrorTypeInvalid, tspec + "networks[0].multus.networkName"}}},
		"VMI": {vmi: true, spec: `
spec:
  networks: [{name: a, multus: {networkName: gone}}]`,
			want: []fieldErr{{field.ErrorTypeNotFound, "spec.networks[0].multus.networkName"}}},
	})
}

func TestBinding(t *testing.T) {
	spec := func(iface, nad string) string {
		return `
spec:
  domain: {devices: {interfaces: [{name: default, masquerade: {}}, ` + iface + `]}}
  networks: [{name: default, pod: {}}, {name: a, multus: {networkName: ` + nad + `}}]`
	}
	i1 := tspec + "domain.devices.interfaces[1]"
	runCases(t, validators.Binding{}, map[string]vcase{
		"bridge on bridge NAD":           {spec: spec("{name: a, bridge: {}}", "br")},
		"default binding on bridge NAD":  {spec: spec("{name: a}", "br")},
		"sriov on SR-IOV NAD":            {spec: spec("{name: a, sriov: {}}", "vf")},
		"plugin on vDPA NAD":             {spec: spec("{name: a, binding: {name: vdpa}}", "vd")},
		"plugin on bridge NAD":           {spec: spec("{name: a, binding: {name: passt}}", "br")},
		"masquerade on Multus":           {spec: spec("{name: a, masquerade: {}}", "br"), want: []fieldErr{{field.ErrorTypeInvalid, i1 + ".masquerade"}}},
		"masquerade on a missing NAD":    {spec: spec("{name: a, masquerade: {}}", "gone"), want: []fieldErr{{field.ErrorTypeInvalid, i1 + ".masquerade"}}},
		"sriov on bridge NAD":            {spec: spec("{name: a, sriov: {}}", "br"), want: []fieldErr{{field.ErrorTypeInvalid, i1 + ".sriov"}}},
		"sriov on vDPA NAD":              {spec: spec("{name: a, sriov: {}}", "vd"), want: []fieldErr{{field.ErrorTypeInvalid, i1 + ".sriov"}}},
		"bridge on SR-IOV NAD":           {spec: spec("{name: a, bridge: {}}", "vf"), want: []fieldErr{{field.ErrorTypeInvalid, i1}}},
		"no binding on SR-IOV NAD":       {spec: spec("{name: a}", "vf"), want: []fieldErr{{field.ErrorTypeInvalid, i1}}},
		"plugin on SR-IOV NAD":           {spec: spec("{name: a, binding: {name: x}}", "vf"), want: []fieldErr{{field.ErrorTypeInvalid, i1}}},
		"bridge on vDPA NAD":             {spec: spec("{name: a, bridge: {}}", "vd"), want: []fieldErr{{field.ErrorTypeInvalid, i1}}},
		"missing NAD is NADs' to report": {spec: spec("{name: a, sriov: {}}", "gone")},
		"missing interface is Topology's": {spec: `
spec:
  networks: [{name: a, multus: {networkName: vf}}]`},
	})
}

func TestDefaultRoute(t *testing.T) {
	runCases(t, validators.DefaultRoute{}, map[string]vcase{
		"one": {spec: `
metadata: {annotations: {a.ns.ovn.kubernetes.io/default_route: "true", b.ns.ovn.kubernetes.io/default_route: "false"}}`},
		"two": {spec: `
metadata: {annotations: {b.ns.ovn.kubernetes.io/default_route: "true", a.ns.ovn.kubernetes.io/default_route: "true", c.ns.ovn.kubernetes.io/ip_address: "10.0.0.1"}}`,
			want: []fieldErr{{field.ErrorTypeInvalid, "spec.template.metadata.annotations[b.ns.ovn.kubernetes.io/default_route]"}}},
		"three on a VMI": {vmi: true, spec: `
metadata: {annotations: {a.kubernetes.io/default_route: "true", b.kubernetes.io/default_route: "true", c.kubernetes.io/default_route: "true"}}`,
			want: []fieldErr{
				{field.ErrorTypeInvalid, "metadata.annotations[b.kubernetes.io/default_route]"},
				{field.ErrorTypeInvalid, "metadata.annotations[c.kubernetes.io/default_route]"},
			}},
	})
}

func TestPlugins(t *testing.T) {
	spec := func(iface, net string) string {
		return `
spec:
  domain:
    devices: {interfaces: [` + iface + `]}
  networks: [` + net + `]`
	}
	vdpa := kubeVirt(`network: {binding: {vdpa: {sidecarImage: x, downwardAPI: device-info}}}`)
	p := tspec + "domain.devices.interfaces[0].binding.name"
	runCases(t, validators.Plugins{}, map[string]vcase{
		"declared":                        {spec: spec("{name: a, binding: {name: vdpa}}", "{name: a, multus: {networkName: vd}}"), kv: vdpa},
		"undeclared on a Multus network":  {spec: spec("{name: a, binding: {name: nosuch}}", "{name: a, multus: {networkName: br}}"), kv: vdpa, want: []fieldErr{{field.ErrorTypeInvalid, p}}},
		"undeclared on the pod network":   {spec: spec("{name: a, binding: {name: passt}}", "{name: a, pod: {}}"), kv: vdpa, want: []fieldErr{{field.ErrorTypeInvalid, p}}},
		"KubeVirt without network config": {spec: spec("{name: a, binding: {name: vdpa}}", "{name: a, multus: {networkName: vd}}"), kv: kubeVirt(""), want: []fieldErr{{field.ErrorTypeInvalid, p}}},
		"no KubeVirt CR visible: warning": {spec: spec("{name: a, binding: {name: vdpa}}", "{name: a, multus: {networkName: vd}}"), wantWarnings: 1},
		"no plugin, nothing to check":     {spec: spec("{name: a, bridge: {}}", "{name: a, multus: {networkName: br}}")},
	})
}

func TestVDPA(t *testing.T) {
	spec := func(iface, extra string) string {
		return `
spec:
  domain:
    ` + extra + `
    devices: {interfaces: [` + iface + `]}
  networks: [{name: a, multus: {networkName: vd}}]`
	}
	const gate = "developerConfiguration: {featureGates: [ReservedOverheadMemlock]}, "
	good := kubeVirt(`{` + gate + `network: {binding: {vdpa: {sidecarImage: x, downwardAPI: device-info, migration: {method: link-refresh}}}}}`)
	noGate := kubeVirt(`network: {binding: {vdpa: {sidecarImage: x, downwardAPI: device-info, migration: {method: link-refresh}}}}`)
	gateDisabled := kubeVirt(`{developerConfiguration: {featureGates: [ReservedOverheadMemlock], disabledFeatureGates: [ReservedOverheadMemlock]}, network: {binding: {vdpa: {sidecarImage: x, downwardAPI: device-info, migration: {}}}}}`)
	noMigration := kubeVirt(`{` + gate + `network: {binding: {vdpa: {sidecarImage: x, downwardAPI: device-info}}}}`)
	noDownward := kubeVirt(`{` + gate + `network: {binding: {vdpa: {sidecarImage: x}}}}`)
	otherPlugin := kubeVirt(`{` + gate + `network: {binding: {passt: {sidecarImage: x}}}}`)
	noNetwork := kubeVirt(`{` + strings.TrimSuffix(gate, ", ") + `}`)
	p := tspec + "domain.devices.interfaces[0].binding.name"
	runCases(t, validators.VDPACheck{}, map[string]vcase{
		"plugin with device-info and migration": {spec: spec("{name: a, binding: {name: vdpa}}", ""), kv: good},
		"no migration: warning":                 {spec: spec("{name: a, binding: {name: vdpa}}", ""), kv: noMigration, wantWarnings: 1},
		// Plugins reports these three, on every network.
		"no KubeVirt CR visible":          {spec: spec("{name: a, binding: {name: vdpa}}", "")},
		"plugin not declared":             {spec: spec("{name: a, binding: {name: vdpa}}", ""), kv: otherPlugin},
		"KubeVirt without network config": {spec: spec("{name: a, binding: {name: vdpa}}", ""), kv: noNetwork},
		"plugin without device-info":      {spec: spec("{name: a, binding: {name: vdpa}}", ""), kv: noDownward, want: []fieldErr{{field.ErrorTypeInvalid, p}}},
		"memLock NotRequired": {spec: spec("{name: a, binding: {name: vdpa}}", "memory: {reservedOverhead: {memLock: NotRequired}}"), kv: good,
			want: []fieldErr{{field.ErrorTypeNotSupported, tspec + "domain.memory.reservedOverhead.memLock"}}},
		"memLock gate off":            {spec: spec("{name: a, binding: {name: vdpa}}", ""), kv: noGate, want: []fieldErr{{field.ErrorTypeRequired, tspec + "domain.memory.reservedOverhead.memLock"}}},
		"memLock gate disabled":       {spec: spec("{name: a, binding: {name: vdpa}}", "memory: {reservedOverhead: {memLock: Required}}"), kv: gateDisabled, want: []fieldErr{{field.ErrorTypeRequired, tspec + "domain.memory.reservedOverhead.memLock"}}},
		"memLock Required":            {spec: spec("{name: a, binding: {name: vdpa}}", "memory: {reservedOverhead: {memLock: Required}}"), kv: good},
		"bridge on vDPA is Binding's": {spec: spec("{name: a, bridge: {}}", "memory: {reservedOverhead: {memLock: NotRequired}}"), kv: good},
		"memLock NotRequired without vDPA": {spec: `
spec:
  domain:
    memory: {reservedOverhead: {memLock: NotRequired}}
    devices: {interfaces: [{name: a, bridge: {}}]}
  networks: [{name: a, multus: {networkName: br}}]`, kv: good},
		"VMI paths": {vmi: true, spec: spec("{name: a, binding: {name: vdpa}}", "memory: {reservedOverhead: {memLock: NotRequired}}"), kv: noDownward,
			want: []fieldErr{
				{field.ErrorTypeInvalid, "spec.domain.devices.interfaces[0].binding.name"},
				{field.ErrorTypeNotSupported, "spec.domain.memory.reservedOverhead.memLock"},
			}},
	})
}

// The default chain, on a VM with one mistake of every class, reports each
// once, with its own path.
func TestDefaultChain(t *testing.T) {
	req := vmRequest(t, `
metadata: {annotations: {a.kubernetes.io/default_route: "true", b.kubernetes.io/default_route: "true"}}
spec:
  domain:
    memory: {reservedOverhead: {memLock: NotRequired}}
    devices: {interfaces: [{name: gone, bridge: {}}, {name: vf, bridge: {}}, {name: vd, binding: {name: vdpa}}, {name: orphan, bridge: {}}]}
  networks: [{name: gone, multus: {networkName: gone}}, {name: vf, multus: {networkName: vf}}, {name: vd, multus: {networkName: vd}}, {name: nointerface, pod: {}}]`, false)
	req.Facts = testFacts(kubeVirt(`network: {binding: {vdpa: {sidecarImage: x}}}`))
	errs, err := chain.RunVMValidators(context.Background(), req, app.Chains(app.Capabilities{}).VMValidators)
	if err != nil {
		t.Fatal(err)
	}
	want := []fieldErr{
		{field.ErrorTypeRequired, tspec + "domain.devices.interfaces"},
		{field.ErrorTypeInvalid, tspec + "domain.devices.interfaces[3].name"},
		{field.ErrorTypeNotFound, tspec + "networks[0].multus.networkName"},
		{field.ErrorTypeInvalid, tspec + "domain.devices.interfaces[1]"},
		{field.ErrorTypeInvalid, "spec.template.metadata.annotations[b.kubernetes.io/default_route]"},
		{field.ErrorTypeInvalid, tspec + "domain.devices.interfaces[2].binding.name"},
		{field.ErrorTypeNotSupported, tspec + "domain.memory.reservedOverhead.memLock"},
	}
	if got := errorTypes(errs); !reflect.DeepEqual(got, want) {
		t.Errorf("errors = %v\nwant %v", got, want)
	}
}
