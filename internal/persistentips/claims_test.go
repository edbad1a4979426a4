package persistentips

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/lookup/lookuptest"
)

func testFacts() *lookup.Snapshot {
	return lookuptest.Facts(
		lookuptest.NAD("a", "blue", "", `{"name":"blue-net","type":"ovn-k8s-cni-overlay","allowPersistentIPs":true}`),
		lookuptest.NAD("shared", "red", "", `{"name":"red-net","type":"ovn-k8s-cni-overlay","allowPersistentIPs":true}`),
		lookuptest.NAD("a", "noname", "", `{"type":"ovn-k8s-cni-overlay","allowPersistentIPs":true}`),
		lookuptest.NAD("a", "plain", "", `{"name":"plain","type":"bridge"}`),
	)
}

const testVM = `{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"web","uid":"u-1"},
"spec":{"template":{"spec":{"domain":{"devices":{}},"networks":[
 {"name":"default","pod":{}},
 {"name":"blue","multus":{"networkName":"blue"}},
 {"name":"red","multus":{"networkName":"shared/red"}},
 {"name":"prim","multus":{"networkName":"blue","default":true}},
 {"name":"noname","multus":{"networkName":"noname"}},
 {"name":"plain","multus":{"networkName":"plain"}},
 {"name":"gone","multus":{"networkName":"gone"}}]}}}}`

func TestOffline(t *testing.T) {
	on := config.Config{}.Default("")
	off := on
	off.PersistentIPs.Enabled = ptr.To(false)
	standalone := `{"kind":"VirtualMachineInstance","metadata":{"name":"solo","uid":"u-2"},"spec":{"domain":{"devices":{}},"networks":[{"name":"blue","multus":{"networkName":"blue"}}]}}`
	owned := `{"kind":"VirtualMachineInstance","metadata":{"name":"web","ownerReferences":[{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","name":"web","uid":"u-1","controller":true}]},"spec":{"domain":{"devices":{}},"networks":[{"name":"blue","multus":{"networkName":"blue"}}]}}`
	tests := map[string]struct {
		cfg  *config.Config
		kind string
		raw  string
		want []string // "name network interface owner"
	}{
		"VM: claimable secondary networks only, NADs across namespaces": {cfg: &on, kind: "VirtualMachine", raw: testVM, want: []string{
			"web.blue blue-net " + PodInterfaceName("blue") + " VirtualMachine/web/u-1",
			"web.red red-net " + PodInterfaceName("red") + " VirtualMachine/web/u-1",
		}},
		"feature off":           {cfg: &off, kind: "VirtualMachine", raw: testVM},
		"standalone VMI":        {cfg: &on, kind: "VirtualMachineInstance", raw: standalone, want: []string{"solo.blue blue-net " + PodInterfaceName("blue") + " VirtualMachineInstance/solo/u-2"}},
		"VMI started by a VM":   {cfg: &on, kind: "VirtualMachineInstance", raw: owned},
		"other kinds untouched": {cfg: &on, kind: "Pod", raw: `{}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out, err := Offline(context.Background(), tc.cfg, testFacts(), tc.kind, "a", []byte(tc.raw))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, b := range out {
				var c struct {
					Kind     string         `json:"kind"`
					Status   map[string]any `json:"status"`
					Metadata struct {
						Name, Namespace string
						Finalizers      []string
						Labels          map[string]string
						OwnerReferences []metav1.OwnerReference
					}
					Spec struct{ Network, Interface string }
				}
				if err := json.Unmarshal(b, &c); err != nil {
					t.Fatal(err)
				}
				if c.Kind != "IPAMClaim" || c.Status != nil || c.Metadata.Namespace != "a" || len(c.Metadata.Finalizers) != 1 || c.Metadata.Finalizers[0] != Finalizer || len(c.Metadata.OwnerReferences) != 1 {
					t.Fatalf("claim %s", b)
				}
				o := c.Metadata.OwnerReferences[0]
				if o.Controller == nil || !*o.Controller || o.BlockOwnerDeletion == nil || !*o.BlockOwnerDeletion || c.Metadata.Labels[VMLabel] != o.Name {
					t.Fatalf("claim %s: owner or label wrong", b)
				}
				got = append(got, fmt.Sprintf("%s %s %s %s/%s/%s", c.Metadata.Name, c.Spec.Network, c.Spec.Interface, o.Kind, o.Name, o.UID))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("claims\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestDesiredReportsWhy(t *testing.T) {
	var vm struct {
		Spec struct {
			Template struct {
				Spec json.RawMessage
			}
		}
	}
	if err := json.Unmarshal([]byte(testVM), &vm); err != nil {
		t.Fatal(err)
	}
	want, skipped, err := Desired(context.Background(), ptr.To(config.Config{}.Default("")), Owner{Kind: "VirtualMachine", Namespace: "a", Name: "web"}, mustSpec(t, vm.Spec.Template.Spec), testFacts())
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 2 {
		t.Fatalf("want %d claims, got %d", 2, len(want))
	}
	reasons := map[string]bool{}
	for _, s := range skipped {
		reasons[s.Network] = true
	}
	if !reasons["noname"] || !reasons["gone"] || reasons["plain"] {
		t.Fatalf("skipped = %+v, want noname and gone (plain simply does not allow persistent IPs)", skipped)
	}
}

func mustSpec(t *testing.T, raw json.RawMessage) *kubevirtv1.VirtualMachineInstanceSpec {
	t.Helper()
	var s kubevirtv1.VirtualMachineInstanceSpec
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}
