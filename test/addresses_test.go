package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/persistentips"
)

const bridgeSubnetConfig = `{"cniVersion":"0.4.0","name":"%s","type":"bridge","bridge":"br1","ipam":{"type":"static","subnet":"10.10.0.0/24"}}`

// Per-network address requests through the real API server: kvnet.io/networks
// asks for IPs, a MAC and CNI args; the bridge network's MAC becomes its
// interface's macAddress and its IPs and CNI args go to the template's
// kvnet.io/addresses (which KubeVirt copies to the launcher pod), the kube-ovn
// network's to kube-ovn's own annotations. The launcher pod then gets them in
// the bridge network's selection element, every other key kept.
func TestAddressRequests(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "lan", "", fmt.Sprintf(bridgeSubnetConfig, "lan"))
	env.CreateNAD(t, ns, "ovn-a", "", fmt.Sprintf(kubeOVNConfig, ""))
	c, warnings := warningClient(t)
	_, err := createVM(t, c, ns, `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: db
  annotations:
    kvnet.io/networks: '[{"name":"lan","nad":"lan","ips":["10.10.0.5/24"],"mac":"02:00:00:00:00:05","cniArgs":{"vlan":"7"}},{"name":"ovn","nad":"ovn-a","ips":["10.16.0.9/16"],"mac":"02:00:00:00:00:09","logicalSwitch":"vm-subnet"}]'
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {}
        resources: {requests: {memory: 1Gi}}
`)
	if err != nil {
		t.Fatal(err)
	}
	vm := getVM(t, ns, "db")
	ann := vm.Spec.Template.ObjectMeta.Annotations
	tbl, err := addresses.Parse(ann[addresses.Annotation])
	if err != nil {
		t.Fatalf("template %s = %q: %v", addresses.Annotation, ann[addresses.Annotation], err)
	}
	// The MAC is the interface's own: KubeVirt gives it to the guest and
	// to the selection element, and a MAC pool sees it there.
	if got := tbl["lan"]; len(tbl) != 1 || strings.Join(got.IPs, ",") != "10.10.0.5/24" || got.MAC != "" || string(got.CNIArgs) != `{"vlan":"7"}` {
		t.Errorf("template %s = %s: want only lan with its ips and cniArgs", addresses.Annotation, ann[addresses.Annotation])
	}
	macs := map[string]string{}
	for _, iface := range vm.Spec.Template.Spec.Domain.Devices.Interfaces {
		macs[iface.Name] = iface.MacAddress
	}
	if macs["lan"] != "02:00:00:00:00:05" || macs["ovn"] != "" {
		t.Errorf("interface MACs = %v, want lan's 02:00:00:00:00:05 and none on ovn (kube-ovn reads its own annotation)", macs)
	}
	p := "ovn-a." + ns + ".ovn.kubernetes.io/"
	for k, v := range map[string]string{p + "ip_address": "10.16.0.9", p + "mac_address": "02:00:00:00:00:09", p + "logical_switch": "vm-subnet"} {
		if ann[k] != v {
			t.Errorf("template annotation %s = %q, want %q", k, ann[k], v)
		}
	}
	if w := warnings.all(); len(w) != 1 || !strings.Contains(w[0], "kube-ovn >= v1.13") {
		t.Errorf("warnings = %q: want only the suite's legacyLiveMigration warning", w)
	}

	// The launcher pod as virt-controller creates it: VMI annotations
	// copied, one selection element per network, interface named by
	// KubeVirt, the interface's macAddress as the element's "mac".
	lanIface := persistentips.PodInterfaceName("lan")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, GenerateName: "virt-launcher-db-",
			Labels: map[string]string{"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": "0b7c5f1e-3333-4a3b-8c9d-000000000003", "vm.kubevirt.io/name": "db"},
			Annotations: map[string]string{
				"kubevirt.io/domain":          "db",
				addresses.Annotation:          ann[addresses.Annotation],
				"k8s.v1.cni.cncf.io/networks": `[{"name":"lan","namespace":"` + ns + `","interface":"` + lanIface + `","mac":"02:00:00:00:00:05","x-vendor":{"keep":true}},{"name":"ovn-a","namespace":"` + ns + `","interface":"` + persistentips.PodInterfaceName("ovn") + `"}]`,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "kubevirt.io/v1", Kind: "VirtualMachineInstance", Name: "db",
				UID: "0b7c5f1e-3333-4a3b-8c9d-000000000003", Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "quay.io/kubevirt/virt-launcher:v1.9.0"}}},
	}
	if err := env.Client.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), &got); err != nil {
		t.Fatal(err)
	}
	var elems []map[string]any
	if err := json.Unmarshal([]byte(got.Annotations["k8s.v1.cni.cncf.io/networks"]), &elems); err != nil || len(elems) != 2 {
		t.Fatalf("networks annotation %q: %v", got.Annotations["k8s.v1.cni.cncf.io/networks"], err)
	}
	lan, _ := json.Marshal(elems[0])
	want := `{"cni-args":{"vlan":"7"},"interface":"` + lanIface + `","ips":["10.10.0.5/24"],"mac":"02:00:00:00:00:05","name":"lan","namespace":"` + ns + `","x-vendor":{"keep":true}}`
	if string(lan) != want {
		t.Errorf("lan element = %s\nwant %s", lan, want)
	}
	if _, ok := elems[1]["ips"]; ok {
		t.Errorf("kube-ovn element got ips: %v (kube-ovn reads its own annotations)", elems[1])
	}
}

// Bad requests are refused on the VM, each naming the field and the reason.
func TestAddressRequestsRefused(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "lan", "", fmt.Sprintf(bridgeSubnetConfig, "lan"))
	env.CreateNAD(t, ns, "lan2", "", fmt.Sprintf(bridgeConfig, "lan2"))
	env.CreateNAD(t, ns, "ovn-a", "", fmt.Sprintf(kubeOVNConfig, ""))
	vm := func(name, networks, templateAnno string) string {
		tmeta := ""
		if templateAnno != "" {
			tmeta = "\n    metadata:\n      annotations:\n        kvnet.io/addresses: '" + templateAnno + "'"
		}
		return `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: ` + name + `
  annotations:
    kvnet.io/networks: '` + networks + `'
spec:
  runStrategy: Halted
  template:` + tmeta + `
    spec:
      domain:
        devices: {}
        resources: {requests: {memory: 1Gi}}
`
	}
	netsPath := "metadata.annotations[kvnet.io/networks]"
	for _, c := range []struct {
		name, networks, tmpl, path, want string
	}{
		{"no-cidr", `[{"name":"lan","nad":"lan","ips":["10.10.0.5"]}]`, "", netsPath, "want an IP in CIDR notation"},
		{"bad-mac", `[{"name":"lan","nad":"lan","mac":"02:00:00:00:00"}]`, "", netsPath, "want a 48-bit MAC"},
		{"outside", `[{"name":"lan","nad":"lan","ips":["10.99.0.5/24"]}]`, "", netsPath, "outside the subnets of NetworkAttachmentDefinition " + ns + "/lan (10.10.0.0/24)"},
		{"dup-ip", `[{"name":"lan","nad":"lan","ips":["10.10.0.5/24"]},{"name":"lan2","nad":"lan2","ips":["10.10.0.5/24"]}]`, "", netsPath, `networks "lan" and "lan2" both ask for IP 10.10.0.5`},
		{"with-claim", `[{"name":"lan","nad":"lan","ips":["10.10.0.5/24"],"persistentIPs":true}]`, "", netsPath, "drop persistentIPs"},
		{"typo", `[{"name":"lan","nad":"lan","ip":["10.10.0.5/24"]}]`, "", netsPath, `unknown field "ip"`},
		{"switch-not-ovn", `[{"name":"lan","nad":"lan","logicalSwitch":"s"}]`, "", netsPath, "logicalSwitch is kube-ovn's"},
		{"tmpl-ovn", `[{"name":"ovn","nad":"ovn-a"}]`, `{"ovn":{"ips":["10.16.0.9/16"]}}`, "spec.template.metadata.annotations[kvnet.io/addresses][ovn]", "kube-ovn attachment"},
		{"tmpl-unknown-net", `[{"name":"lan","nad":"lan"}]`, `{"nope":{"mac":"02:00:00:00:00:07"}}`, "spec.template.metadata.annotations[kvnet.io/addresses][nope]", "not a Multus network of this VM"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := createVM(t, env.Client, ns, vm(c.name, c.networks, c.tmpl))
			hasCause(t, err, c.path, c.want)
		})
	}
}

// Fixed ips on an OVN-Kubernetes secondary network that assigns addresses
// itself (layer2 with "subnets") are refused through the real API server:
// a 422 with one cause, on the annotation that asked, saying what OVN-K
// would do and what to use instead. A layer2 NAD without subnets takes
// them, with no warning about claims.
func TestAddressRequestsRefusedOnOVNKubernetesIPAM(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	env.CreateNAD(t, ns, "tenant", "", fmt.Sprintf(piPersistentConfig, "tenant-net", ns+"/tenant"))
	env.CreateNAD(t, ns, "static-l2", "", `{"cniVersion":"1.0.0","name":"static-l2","type":"ovn-k8s-cni-overlay","topology":"layer2","netAttachDefName":"`+ns+`/static-l2"}`)
	vm := func(name, nad string) string {
		return `
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: ` + name + `
  annotations:
    kvnet.io/networks: '[{"name":"tenant","nad":"` + nad + `","ips":["10.100.0.7/24"]}]'
spec:
  runStrategy: Halted
  template:
    spec:
      domain:
        devices: {}
        resources: {requests: {memory: 1Gi}}
`
	}
	_, err := createVM(t, env.Client, ns, vm("pinned", "tenant"))
	hasCause(t, err, "metadata.annotations[kvnet.io/networks]", `cannot allocate a static IP request with IPAM`)
	hasCause(t, err, "metadata.annotations[kvnet.io/networks]", "the NAD allows persistent IPs, so kvnet's IPAMClaim keeps the address")
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != 422 || len(status.Status().Details.Causes) != 1 {
		t.Fatalf("want a 422 with one cause, got %v", err)
	}

	c, warnings := warningClient(t)
	if _, err := createVM(t, c, ns, vm("static", "static-l2")); err != nil {
		t.Fatalf("layer2 NAD without subnets: %v", err)
	}
	if w := strings.Join(warnings.all(), "\n"); strings.Contains(w, "IPAMClaim") {
		t.Errorf("warnings %q speak of a claim on a network without IPAM", w)
	}
}
