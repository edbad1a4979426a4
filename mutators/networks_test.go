package mutators_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/mutators"
)

const rulesConfig = `
networkRules:
  - name: prod-storage
    namespaceSelector: {matchLabels: {env: prod}}
    networks: [{name: storage, nad: br}]
  - name: db
    vmSelector: {matchLabels: {app: db}}
    networks: [{name: fast, nad: tenant-a/vf}]
  - name: dev-only
    namespaceSelector: {matchExpressions: [{key: env, operator: In, values: [dev]}]}
    vmSelector: {matchLabels: {app: db}}
    networks: [{name: devnet, nad: br, binding: bridge}]
`

// netSummary renders networks and interfaces as "name=source" and
// "name:binding" so tables can state the expected spec in one line.
func netSummary(spec *kubevirtv1.VirtualMachineInstanceSpec) (nets, ifaces []string) {
	for _, n := range spec.Networks {
		src := "pod"
		if n.Multus != nil {
			src = n.Multus.NetworkName
		}
		nets = append(nets, n.Name+"="+src)
	}
	for _, i := range spec.Domain.Devices.Interfaces {
		b := "none"
		switch {
		case i.Binding != nil:
			b = "plugin:" + i.Binding.Name
		case i.Bridge != nil:
			b = "bridge"
		case i.SRIOV != nil:
			b = "sriov"
		case i.Masquerade != nil:
			b = "masquerade"
		}
		ifaces = append(ifaces, i.Name+":"+b)
	}
	return nets, ifaces
}

func TestNetworkInjector(t *testing.T) {
	type tc struct {
		vm         string
		namespace  string
		config     string
		wantNets   []string
		wantIfaces []string
		wantRecord []chain.Change
		wantDR     []string // networks marked for the default route
		wantErr    string   // field path of a 422 cause
		kubevirt   *kubevirtv1.KubeVirt
	}
	podOnly := `
metadata: {name: vm1%s}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: default, masquerade: {}}]}}
      networks: [{name: default, pod: {}}]
`
	vm := func(meta string) string { return fmt.Sprintf(podOnly, meta) }
	cases := map[string]tc{
		"namespace label selects a rule": {
			vm:         vm(""),
			wantNets:   []string{"default=pod", "storage=br"},
			wantIfaces: []string{"default:masquerade", "storage:bridge"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "prod-storage", Networks: []string{"storage"}}},
		},
		"namespace label does not match": {
			vm:         vm(""),
			namespace:  "other",
			wantNets:   []string{"default=pod"},
			wantIfaces: []string{"default:masquerade"},
		},
		"unknown namespace matches only rules without namespace selector": {
			vm:         vm(", labels: {app: db}"),
			namespace:  "nowhere",
			wantNets:   []string{"default=pod", "fast=tenant-a/vf"},
			wantIfaces: []string{"default:masquerade", "fast:sriov"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "db", Networks: []string{"fast"}}},
		},
		"VM label selects a rule, auto binds SR-IOV": {
			vm:         vm(", labels: {app: db}"),
			wantNets:   []string{"default=pod", "storage=br", "fast=tenant-a/vf"},
			wantIfaces: []string{"default:masquerade", "storage:bridge", "fast:sriov"},
			wantRecord: []chain.Change{
				{Mutator: "networks", Rule: "prod-storage", Networks: []string{"storage"}},
				{Mutator: "networks", Rule: "db", Networks: []string{"fast"}},
			},
		},
		"both selectors must match": {
			vm:         vm(", labels: {app: db}"),
			namespace:  "other",
			wantNets:   []string{"default=pod", "fast=tenant-a/vf", "devnet=br"},
			wantIfaces: []string{"default:masquerade", "fast:sriov", "devnet:bridge"},
			wantRecord: []chain.Change{
				{Mutator: "networks", Rule: "db", Networks: []string{"fast"}},
				{Mutator: "networks", Rule: "dev-only", Networks: []string{"devnet"}},
			},
		},
		"annotation short form with interface name: auto binds vDPA plugin": {
			vm:         vm(", annotations: {kvnet.io/networks: 'tenant-a/vd@dp'}"),
			config:     "vdpa: {bindingPlugin: jaguar}",
			wantNets:   []string{"default=pod", "dp=tenant-a/vd"},
			wantIfaces: []string{"default:masquerade", "dp:plugin:jaguar"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"dp"}}},
		},
		"annotation short form list, name defaults to the NAD name": {
			vm:         vm(", annotations: {kvnet.io/networks: ' shared/br2, vf '}"),
			config:     "{}",
			wantNets:   []string{"default=pod", "br2=shared/br2", "vf=vf"},
			wantIfaces: []string{"default:masquerade", "br2:bridge", "vf:sriov"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"br2", "vf"}}},
		},
		"annotation JSON form with binding and default route": {
			vm:         vm(`, annotations: {kvnet.io/networks: '[{"name":"a","nad":"ovn","defaultRoute":true},{"name":"b","nad":"br","binding":"sriov"},{"name":"c","nad":"vf","binding":"my-plugin"}]'}`),
			config:     "{}",
			wantNets:   []string{"default=pod", "a=ovn", "b=br", "c=vf"},
			wantIfaces: []string{"default:masquerade", "a:bridge", "b:sriov", "c:plugin:my-plugin"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"a", "b", "c"}}},
			wantDR:     []string{"a"},
		},
		"rules come before the annotation; a name asked twice is added once": {
			vm:         vm(", annotations: {kvnet.io/networks: 'storage@storage, ovn'}"),
			wantNets:   []string{"default=pod", "storage=br", "ovn=ovn"},
			wantIfaces: []string{"default:masquerade", "storage:bridge", "ovn:bridge"},
			wantRecord: []chain.Change{
				{Mutator: "networks", Rule: "prod-storage", Networks: []string{"storage"}},
				{Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"ovn"}},
			},
		},
		"a missing NAD with auto binding gets bridge": {
			vm:         vm(", annotations: {kvnet.io/networks: 'nope'}"),
			config:     "{}",
			wantNets:   []string{"default=pod", "nope=nope"},
			wantIfaces: []string{"default:masquerade", "nope:bridge"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"nope"}}},
		},
		"user network of the same name is not rewritten": {
			vm: `
metadata: {name: vm1}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: storage, sriov: {}}]}}
      networks: [{name: storage, multus: {networkName: vf}}]
`,
			wantNets:   []string{"storage=vf"},
			wantIfaces: []string{"storage:sriov"},
		},
		"user network attaching the same NAD under another name is not duplicated": {
			vm: `
metadata: {name: vm1}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: mine, bridge: {}}]}}
      networks: [{name: mine, multus: {networkName: tenant-a/br}}]
`,
			wantNets:   []string{"mine=tenant-a/br"},
			wantIfaces: []string{"mine:bridge"},
		},
		"same NAD in another namespace is a different NAD": {
			vm: `
metadata: {name: vm1}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: mine, bridge: {}}]}}
      networks: [{name: mine, multus: {networkName: other/br}}]
`,
			wantNets:   []string{"mine=other/br", "storage=br"},
			wantIfaces: []string{"mine:bridge", "storage:bridge"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "prod-storage", Networks: []string{"storage"}}},
		},
		"default route asked for a NAD the user attached marks the user's network": {
			vm: `
metadata: {name: vm1, annotations: {kvnet.io/networks: '[{"name":"x","nad":"ovn","defaultRoute":true}]'}}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: mine, bridge: {}}]}}
      networks: [{name: mine, multus: {networkName: ovn}}]
`,
			config:     "{}",
			wantNets:   []string{"mine=ovn"},
			wantIfaces: []string{"mine:bridge"},
			wantDR:     []string{"mine"},
		},
		"an interface the user wrote without its network keeps its binding": {
			vm: `
metadata: {name: vm1}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: storage, sriov: {}}]}}
`,
			wantNets:   []string{"storage=br"},
			wantIfaces: []string{"storage:sriov"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "prod-storage", Networks: []string{"storage"}}},
		},
		"a VM without networks keeps the pod network KubeVirt would attach": {
			vm:         "metadata: {name: vm1, annotations: {kvnet.io/networks: vd@dp}}\nspec: {template: {spec: {domain: {devices: {}}}}}",
			config:     "{}",
			wantNets:   []string{"default=pod", "dp=vd"},
			wantIfaces: []string{"default:bridge", "dp:plugin:vdpa"},
			wantRecord: []chain.Change{{Mutator: "networks", Networks: []string{"default"}}, {Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"dp"}}},
		},
		"the kept pod network binds as the KubeVirt CR's defaultNetworkInterface": {
			vm:         "metadata: {name: vm1, annotations: {kvnet.io/networks: br}}\nspec: {template: {spec: {domain: {devices: {}}}}}",
			config:     "{}",
			kubevirt:   &kubevirtv1.KubeVirt{Spec: kubevirtv1.KubeVirtSpec{Configuration: kubevirtv1.KubeVirtConfiguration{NetworkConfiguration: &kubevirtv1.NetworkConfiguration{NetworkInterface: "masquerade"}}}},
			wantNets:   []string{"default=pod", "br=br"},
			wantIfaces: []string{"default:masquerade", "br:bridge"},
			wantRecord: []chain.Change{{Mutator: "networks", Networks: []string{"default"}}, {Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"br"}}},
		},
		"autoattachPodInterface false: no pod network": {
			vm:         "metadata: {name: vm1, annotations: {kvnet.io/networks: br}}\nspec: {template: {spec: {domain: {devices: {autoattachPodInterface: false}}}}}",
			config:     "{}",
			wantNets:   []string{"br=br"},
			wantIfaces: []string{"br:bridge"},
			wantRecord: []chain.Change{{Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"br"}}},
		},
		"nothing to add: no pod network either": {
			vm:     "metadata: {name: vm1}\nspec: {template: {spec: {domain: {devices: {}}}}}",
			config: "{}",
		},
		"malformed annotation is the user's error on the annotation": {
			vm:      vm(", annotations: {kvnet.io/networks: 'a/b/c'}"),
			wantErr: "metadata.annotations[kvnet.io/networks]",
		},
		"JSON annotation with an unknown key is refused": {
			vm:      vm(`, annotations: {kvnet.io/networks: '[{"name":"a","nad":"br","bogus":1}]'}`),
			wantErr: "metadata.annotations[kvnet.io/networks]",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfgYAML := rulesConfig
			if c.config != "" {
				cfgYAML = c.config
			}
			_, req := vmRequest(t, c.vm, mustConfig(t, cfgYAML))
			if c.namespace != "" {
				req.Namespace = c.namespace
			}
			if c.kubevirt != nil {
				req.Facts.(*lookup.Snapshot).KubeVirtCR = c.kubevirt
			}
			err := mutators.NetworkInjector{}.Mutate(context.Background(), req)
			if c.wantErr != "" {
				var se *apierrors.StatusError
				if !errors.As(err, &se) || se.Status().Code != 422 {
					t.Fatalf("err = %v, want a 422", err)
				}
				causes := se.Status().Details.Causes
				if len(causes) == 0 || causes[0].Field != c.wantErr {
					t.Fatalf("causes = %+v, want field %s", causes, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Mutate: %v", err)
			}
			nets, ifaces := netSummary(req.Spec)
			if !reflect.DeepEqual(nets, c.wantNets) {
				t.Errorf("networks = %v, want %v", nets, c.wantNets)
			}
			if !reflect.DeepEqual(ifaces, c.wantIfaces) {
				t.Errorf("interfaces = %v, want %v", ifaces, c.wantIfaces)
			}
			if !reflect.DeepEqual(req.Changes, c.wantRecord) {
				t.Errorf("changes = %+v, want %+v", req.Changes, c.wantRecord)
			}
			if dr := req.DefaultRoute; !reflect.DeepEqual(dr, c.wantDR) {
				t.Errorf("default route = %v, want %v", dr, c.wantDR)
			}
		})
	}
}

// The user's own network objects are kept byte for byte: kvnet appends,
// never rewrites an element it did not add.
func TestNetworkInjectorKeepsUserElements(t *testing.T) {
	_, req := vmRequest(t, `
metadata: {name: vm1}
spec:
  template:
    spec:
      domain: {devices: {interfaces: [{name: mine, bridge: {}, macAddress: "02:00:00:00:00:01", model: e1000}]}}
      networks: [{name: mine, multus: {networkName: br, default: false}}]
`, mustConfig(t, rulesConfig))
	before := req.Spec.DeepCopy()
	if err := (mutators.NetworkInjector{}).Mutate(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(req.Spec.Networks, before.Networks) || !reflect.DeepEqual(req.Spec.Domain.Devices.Interfaces, before.Domain.Devices.Interfaces) {
		t.Fatalf("user networks changed:\n got %+v\nwant %+v", req.Spec.Networks, before.Networks)
	}
}
