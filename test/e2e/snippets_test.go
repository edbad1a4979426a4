package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/kvnet/kvnet/test/docsnippets"
	"github.com/kvnet/kvnet/test/framework"
)

// guideVMChecks apply a VM carrying a guide's snippet (its metadata) in
// a namespace made for it, through kvnet, KubeVirt's virt-api and
// virt-controller on the real API server, and check what the guide says
// happens, by the snippet's id (<!-- snippet: vm: <id> -->).
var guideVMChecks = map[string]func(t *testing.T, annotations map[string]string){
	// docs/networks.md, "Fixed addresses per network": the MAC becomes the
	// interface's macAddress; ips and cniArgs reach the launcher pod's
	// element; a kube-ovn attachment gets kube-ovn's own annotations.
	"fixed-addresses": func(t *testing.T, annotations map[string]string) {
		ns := env.NewNamespace(t, nil)
		env.CreateNAD(t, ns, "lan", "", `{"cniVersion":"0.4.0","name":"lan","type":"bridge","bridge":"br1"}`)
		env.CreateNAD(t, ns, "ovn-a", "", kubeOVNConfig)
		vm, err := createGuideVM(t, ns, "db", annotations)
		if err != nil {
			t.Fatalf("the guide's VM is refused: %v", err)
		}
		macs, _ := interfaceMACs(t, ns, vm.Name)
		if macs["lan"] != "02:00:00:00:00:05" {
			t.Errorf("interface MACs %v: want lan's to be the guide's 02:00:00:00:00:05", macs)
		}
		vmi := waitVMI(t, ns, vm.Name)
		pod := waitLauncherPod(t, vmi)
		e := selection(t, pod)["lan"]
		if e == nil {
			t.Fatalf("launcher pod has no lan attachment: %s", pod.Annotations["k8s.v1.cni.cncf.io/networks"])
		}
		for key, want := range map[string]string{"ips": `["10.10.0.5/24","fd00:10::5/64"]`, "mac": `"02:00:00:00:00:05"`, "cni-args": `{"vlan":"7"}`} {
			if got := string(e.Raw(key)); got != want {
				t.Errorf("lan element %s = %s, want %s", key, got, want)
			}
		}
		provider := "ovn-a." + ns + ".ovn.kubernetes.io/"
		for key, want := range map[string]string{"ip_address": "10.16.0.9", "logical_switch": "vm-subnet"} {
			if got := pod.Annotations[provider+key]; got != want {
				t.Errorf("launcher pod %s%s = %q, want %s", provider, key, got, want)
			}
		}
	},
	// docs/kube-ovn.md: the default route and the fixed addresses of one
	// of two kube-ovn networks become kube-ovn's annotations on the
	// launcher pod, for that network's provider alone.
	"kube-ovn-default-route": func(t *testing.T, annotations map[string]string) {
		ns := env.NewNamespace(t, nil)
		env.CreateNAD(t, ns, "ovn-mgmt", "", kubeOVNConfig)
		env.CreateNAD(t, ns, "ovn-app", "", kubeOVNConfig)
		vm, err := createGuideVM(t, ns, "app", annotations)
		if err != nil {
			t.Fatalf("the guide's VM is refused: %v", err)
		}
		pod := waitLauncherPod(t, waitVMI(t, ns, vm.Name))
		app, mgmt := "ovn-app."+ns+".ovn.kubernetes.io/", "ovn-mgmt."+ns+".ovn.kubernetes.io/"
		for key, want := range map[string]string{"default_route": "true", "ip_address": "10.16.0.20", "mac_address": "02:00:00:00:16:20", "logical_switch": "app-subnet"} {
			if got := pod.Annotations[app+key]; got != want {
				t.Errorf("launcher pod %s%s = %q, want %q", app, key, got, want)
			}
			if got, ok := pod.Annotations[mgmt+key]; ok {
				t.Errorf("launcher pod %s%s = %q; the guide asks nothing of ovn-mgmt", mgmt, key, got)
			}
		}
	},
	// docs/persistent-ips.md, "Validation": persistentIPs asked on a NAD
	// that does not allow them is refused, the cause naming the
	// annotation.
	"persistent-ips-refused": func(t *testing.T, annotations map[string]string) {
		ns := env.NewNamespace(t, nil)
		env.CreateNAD(t, ns, "tenant-l2", "", `{"cniVersion":"1.0.0","name":"tenant-l2","type":"ovn-k8s-cni-overlay","topology":"layer2","netAttachDefName":"`+ns+`/tenant-l2"}`)
		_, err := createGuideVM(t, ns, "web", annotations)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.annotations[kvnet.io/networks]") {
			t.Fatalf("the guide's VM: %v; want 422 naming metadata.annotations[kvnet.io/networks]", err)
		}
	},
}

// Every VM snippet of the guides is applied through kvnet and does what
// the guide says (test/docs checks that every snippet says how it runs).
func TestGuideSnippetsThroughKvnet(t *testing.T) {
	all, err := docsnippets.All(framework.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range all {
		if s.Kind != "vm" {
			continue
		}
		ids = append(ids, s.Arg)
		check := guideVMChecks[s.Arg]
		if check == nil {
			t.Errorf("%s: no check for VM snippet %q in guideVMChecks", s, s.Arg)
			continue
		}
		var obj struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := yaml.UnmarshalStrict([]byte(s.Text), &obj); err != nil {
			t.Errorf("%s: %v", s, err)
			continue
		}
		t.Run(s.Arg, func(t *testing.T) { check(t, obj.Metadata.Annotations) })
	}
	for id := range guideVMChecks {
		if !slices.Contains(ids, id) {
			t.Errorf("guideVMChecks has %q, which no guide's snippet is", id)
		}
	}
}

// createGuideVM creates vmYAML's VM with the snippet's annotations.
func createGuideVM(t *testing.T, ns, name string, annotations map[string]string) (*kubevirtv1.VirtualMachine, error) {
	t.Helper()
	var vm kubevirtv1.VirtualMachine
	if err := yaml.UnmarshalStrict([]byte(vmYAML(name, "", "", "")), &vm); err != nil {
		t.Fatal(err)
	}
	vm.Namespace = ns
	if vm.Annotations == nil {
		vm.Annotations = map[string]string{}
	}
	for k, v := range annotations {
		vm.Annotations[k] = v
	}
	return &vm, env.Client.Create(context.Background(), &vm)
}
