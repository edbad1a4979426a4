package mutators_test

import (
	"testing"

	nadv1 "github.com/k8snetworkplumbingwg/network-attachment-definition-client/pkg/apis/k8s.cni.cncf.io/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

const ns = "tenant-a"

// nadInfo parses a NAD the way the webhook's cache does.
func nadInfo(namespace, name, resource, cniConfig string) *netattach.Info {
	n := &nadv1.NetworkAttachmentDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       nadv1.NetworkAttachmentDefinitionSpec{Config: cniConfig},
	}
	if resource != "" {
		n.Annotations = map[string]string{netattach.ResourceNameAnnotation: resource}
	}
	return netattach.Parse(n)
}

// testFacts is one small cluster: a NAD of every kind kvnet tells apart.
func testFacts() *lookup.Snapshot {
	s := &lookup.Snapshot{
		NADs: map[string]*netattach.Info{},
		Namespaces: map[string]map[string]string{
			ns:      {"env": "prod"},
			"other": {"env": "dev"},
		},
	}
	for _, i := range []*netattach.Info{
		nadInfo(ns, "br", "", `{"cniVersion":"0.4.0","name":"br","type":"bridge"}`),
		nadInfo(ns, "vf", "intel.com/sriov_netdevice", `{"cniVersion":"0.4.0","name":"vf","type":"sriov"}`),
		nadInfo(ns, "vd", "jaguarmicro.com/jaguar", `{"cniVersion":"0.4.0","name":"vd","type":"sriov"}`),
		nadInfo(ns, "ovn", "", `{"cniVersion":"0.3.0","type":"kube-ovn"}`),
		nadInfo(ns, "ovnp", "", `{"cniVersion":"0.3.0","type":"kube-ovn","provider":"custom.prov"}`),
		nadInfo(ns, "ovn2", "", `{"cniVersion":"0.3.0","type":"kube-ovn"}`),
		nadInfo("shared", "br2", "", `{"cniVersion":"0.4.0","name":"br2","type":"bridge"}`),
		nadInfo("other", "br", "", `{"cniVersion":"0.4.0","name":"br","type":"bridge"}`),
	} {
		s.NADs[i.Ref()] = i
	}
	return s
}

func mustConfig(t testing.TB, y string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(y), "kvnet-system")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

// vmRequest builds the chain request the webhook builds for a VM.
func vmRequest(t testing.TB, vmYAML string, cfg *config.Config) (*kubevirtv1.VirtualMachine, *chain.Request) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := yaml.UnmarshalStrict([]byte(vmYAML), &vm); err != nil {
		t.Fatalf("test VM: %v", err)
	}
	if vm.Namespace == "" {
		vm.Namespace = ns
	}
	req := chain.ForVM(&vm)
	req.Operation, req.Config, req.Facts = "CREATE", cfg, testFacts()
	return &vm, req
}
