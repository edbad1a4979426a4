package mutators

import (
	"context"
	"strings"
	"testing"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/peers"
	"github.com/kvnet/kvnet/internal/persistentips"
)

// riVMIM is the receive VMIM "web-in" of crVMI, UID uid.
func riVMIM(uid string, receive bool) *kubevirtv1.VirtualMachineInstanceMigration {
	m := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: crNS, Name: "web-in", UID: types.UID("vmim-" + uid)},
		Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "web"}}
	if receive {
		m.Spec.Receive = &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: "mig-1"}
	}
	return m
}

// refusedVMIM is riVMIM("a") with kvnet's note of a refused identity.
func refusedVMIM(note string) *kubevirtv1.VirtualMachineInstanceMigration {
	m := riVMIM("a", true)
	m.Annotations = map[string]string{persistentips.RefusedAnnotation: note}
	return m
}

// riClaim is crVMI's claim of network, with ips and the kvnet.io/mac
// annotation mac ("" for none).
func riClaim(network, mac string, ips ...string) *ipamv1alpha1.IPAMClaim {
	c := persistentips.NewClaim(persistentips.Owner{Kind: "VirtualMachine", Namespace: crNS, Name: "web", UID: crVMUID}, network, network+"-net")
	if mac != "" {
		c.Annotations = map[string]string{persistentips.MACAnnotation: mac}
	}
	c.Status.IPs = ips
	return c
}

// riPod is the target pod virt-controller creates for receive VMIM
// web-in (label and annotation), with its claim references already set
// (ClaimRefs runs first).
func riPod(networks string) *corev1.Pod {
	pod := crPod(networks)
	pod.Labels[kubevirtv1.MigrationJobLabel] = "vmim-a"
	pod.Annotations[kubevirtv1.MigrationJobNameAnnotation] = "web-in"
	return pod
}

// riElems is blue's and red's elements with their claim references and
// extra keys for blue.
func riElems(blueExtra string) string {
	return `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","ipam-claim-reference":"web.blue"` + blueExtra + `},` +
		`{"name":"red","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("red") + `","ipam-claim-reference":"web.red"}]`
}

// ReceivedIdentity decides on a receiving VM's target pod from its claims
// alone: denied while any claim it references holds no IPs, then given
// each claim's MAC; any pod that is not a receive VMIM's target pod is
// left as it came.
func TestReceivedIdentity(t *testing.T) {
	off := config.Config{}.Default("")
	off.PersistentIPs.Enabled = ptr.To(false)
	const blueMAC, redMAC = "02:6b:76:00:00:09", "02:6b:76:00:00:0a"
	for name, c := range map[string]struct {
		pod       *corev1.Pod
		op        admissionv1.Operation
		cfg       *config.Config
		cache     client.Reader
		api       client.Reader
		want      string // the networks annotation after; "" unchanged
		forbidden string // the denial's message, if denied
		warning   string
		ipamExt   bool // ipam-extensions' webhook is registered
	}{
		"beside ipam-extensions, an element it has not referenced yet still waits for its claim": {
			pod: riPod(crElems("blue", "red")), ipamExt: true,
			cache:     crClient(crVMI(), riVMIM("a", true), riClaim("blue", blueMAC, "10.1.0.9/24"), riClaim("red", "")),
			forbidden: "the claims of networks red (IPAMClaim web.red) hold no IPs yet",
		},
		"beside ipam-extensions, claims with IPs: admitted, MACs set, references left to it": {
			pod: riPod(crElems("blue")), ipamExt: true,
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("blue", blueMAC, "10.1.0.9/24")),
			want:  `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","mac":"` + blueMAC + `"}]`,
		},
		"without ipam-extensions, an element without a reference is not kvnet's to hold": {
			pod:   riPod(crElems("red")),
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("red", "")),
		},
		"both claims hold IPs: each element gets its claim's MAC": {
			pod:   riPod(riElems("")),
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("blue", blueMAC, "10.1.0.9/24", "fd00::9/64"), riClaim("red", redMAC, "10.2.0.9/24")),
			want: `[{"name":"blue","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("blue") + `","ipam-claim-reference":"web.blue","mac":"` + blueMAC + `"},` +
				`{"name":"red","namespace":"tenant-a","interface":"` + persistentips.PodInterfaceName("red") + `","ipam-claim-reference":"web.red","mac":"` + redMAC + `"}]`,
		},
		"a claim without IPs: denied, naming the network and the claim": {
			pod:       riPod(riElems("")),
			cache:     crClient(crVMI(), riVMIM("a", true), riClaim("blue", blueMAC, "10.1.0.9/24"), riClaim("red", "")),
			forbidden: "target pod of migration web-in: the claims of networks red (IPAMClaim web.red) hold no IPs yet",
		},
		"an identity refused: the denial repeats why": {
			pod: riPod(riElems("")),
			cache: crClient(crVMI(), refusedVMIM("ip-held: networks[red].ips: 10.2.0.9 is already held"),
				riClaim("blue", blueMAC, "10.1.0.9/24"), riClaim("red", "")),
			forbidden: "hold no IPs yet; kvnet admits the pod once the source cluster's network identity is in them (see the events of VirtualMachineInstanceMigration web-in); the source cluster's network identity was refused: ip-held: networks[red].ips: 10.2.0.9 is already held",
		},
		"a claim that does not exist yet: denied": {
			pod:       riPod(riElems("")),
			cache:     crClient(crVMI(), riVMIM("a", true), riClaim("blue", blueMAC, "10.1.0.9/24")),
			forbidden: "networks red (IPAMClaim web.red)",
		},
		"the cache has the claim without IPs, the API with them: admitted": {
			pod:   riPod(riElems("")),
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("blue", "", "10.1.0.9/24"), riClaim("red", "")),
			api:   crClient(riVMIM("a", true), riClaim("red", "", "10.2.0.9/24")),
			want:  "", // no MACs to set
		},
		"the element's own MAC is replaced by the source's, with a warning": {
			pod:     riPod(riElems(`,"mac":"02:00:00:00:00:01"`)),
			cache:   crClient(crVMI(), riVMIM("a", true), riClaim("blue", blueMAC, "10.1.0.9/24"), riClaim("red", "", "10.2.0.9/24")),
			want:    riElems(`,"mac":"` + blueMAC + `"`),
			warning: "the source cluster's MAC " + blueMAC + ` replaces "02:00:00:00:00:01"`,
		},
		"the same MAC already: unchanged": {
			pod:   riPod(riElems(`,"mac":"` + strings.ToUpper(blueMAC) + `"`)),
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("blue", blueMAC, "10.1.0.9/24"), riClaim("red", "", "10.2.0.9/24")),
		},
		"a claim's kvnet.io/mac that is no MAC: admitted with a warning, KubeVirt's MAC kept": {
			pod:     riPod(riElems("")),
			cache:   crClient(crVMI(), riVMIM("a", true), riClaim("blue", "not-a-mac", "10.1.0.9/24"), riClaim("red", "", "10.2.0.9/24")),
			warning: `IPAMClaim web.blue has kvnet.io/mac "not-a-mac", not a MAC`,
		},
		"the VMIM is an in-cluster migration's: left alone": {
			pod:   riPod(riElems("")),
			cache: crClient(crVMI(), riVMIM("a", false), riClaim("blue", ""), riClaim("red", "")),
		},
		"the VMIM of that name is another migration (UID): left alone": {
			pod:   riPod(riElems("")),
			cache: crClient(crVMI(), riVMIM("b", true), riClaim("blue", ""), riClaim("red", "")),
		},
		"no such VMIM: left alone": {
			pod:   riPod(riElems("")),
			cache: crClient(crVMI(), riClaim("blue", ""), riClaim("red", "")),
		},
		"a launcher pod that is no migration's target: left alone": {
			pod:   crPod(riElems("")),
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("blue", ""), riClaim("red", "")),
		},
		"an UPDATE: left alone": {
			pod: riPod(riElems("")), op: admissionv1.Update,
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("blue", ""), riClaim("red", "")),
		},
		"persistent IPs off: left alone": {
			pod: riPod(riElems("")), cfg: &off,
			cache: crClient(crVMI(), riVMIM("a", true), riClaim("blue", ""), riClaim("red", "")),
		},
	} {
		t.Run(name, func(t *testing.T) {
			before := c.pod.Annotations[multus.NetworksAnnotation]
			req := crRequest(c.pod, c.cfg)
			if c.ipamExt {
				facts := crFacts()
				facts.Webhooks = []admissionregv1.MutatingWebhookConfiguration{{ObjectMeta: metav1.ObjectMeta{Name: "ipam"},
					Webhooks: []admissionregv1.MutatingWebhook{{Name: peers.IPAMExtensionsWebhook, Rules: []admissionregv1.RuleWithOperations{{
						Operations: []admissionregv1.OperationType{admissionregv1.Create},
						Rule:       admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}}}}}}
				req.Facts = facts
			}
			if c.op != "" {
				req.Operation = c.op
			}
			err := ReceivedIdentity{Cache: c.cache, API: c.api}.MutatePod(context.Background(), req)
			if c.forbidden != "" {
				if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), c.forbidden) {
					t.Fatalf("got %v, want 403 saying %q", err, c.forbidden)
				}
				if got := c.pod.Annotations[multus.NetworksAnnotation]; got != before {
					t.Errorf("a denied pod was changed: %s", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("MutatePod: %v", err)
			}
			want := c.want
			if want == "" {
				want = before
			}
			if got := c.pod.Annotations[multus.NetworksAnnotation]; got != want {
				t.Errorf("networks annotation\n got %s\nwant %s", got, want)
			}
			switch joined := strings.Join(req.Warnings, "\n"); {
			case c.warning == "" && joined != "":
				t.Errorf("unexpected warnings %q", req.Warnings)
			case c.warning != "" && !strings.Contains(joined, c.warning):
				t.Errorf("warnings %q lack %q", req.Warnings, c.warning)
			}
		})
	}
}
