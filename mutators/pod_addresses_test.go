package mutators

import (
	"context"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/persistentips"
)

func TestAddressesPod(t *testing.T) {
	a := persistentips.PodInterfaceName("a")
	for name, c := range map[string]struct {
		networks, table string
		want            string // the networks annotation after; "" = unchanged
		warn            string
	}{
		"ips, mac, cni-args added; other keys kept": {
			networks: `[{"name":"br","namespace":"ns1","interface":"` + a + `","x":1}]`,
			table:    `{"a":{"ips":["10.0.0.5/24"],"mac":"02:00:00:00:00:05","cniArgs":{"k":"v"}}}`,
			want:     `[{"name":"br","namespace":"ns1","interface":"` + a + `","x":1,"ips":["10.0.0.5/24"],"mac":"02:00:00:00:00:05","cni-args":{"k":"v"}}]`,
		},
		"keys already on the element are kept": {
			networks: `[{"name":"br","interface":"` + a + `","ips":["10.0.0.9/24"]}]`,
			table:    `{"a":{"ips":["10.0.0.5/24"]}}`,
		},
		"no element for the network: a warning": {
			networks: `[{"name":"br","interface":"net1"}]`,
			table:    `{"a":{"mac":"02:00:00:00:00:05"}}`,
			warn:     "network a: no selection element with interface " + a,
		},
		"malformed table: a warning, pod unchanged": {
			networks: `[{"name":"br","interface":"` + a + `"}]`,
			table:    `{"a":{"ip":["10.0.0.5/24"]}}`,
			warn:     "kvnet ignores kvnet.io/addresses",
		},
	} {
		t.Run(name, func(t *testing.T) {
			pod := crPod(c.networks)
			pod.Annotations[addresses.Annotation] = c.table
			req := crRequest(pod, nil)
			if err := (AddressesPod{}).MutatePod(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			want := c.want
			if want == "" {
				want = c.networks
			}
			if got := pod.Annotations[multus.NetworksAnnotation]; got != want {
				t.Errorf("networks annotation:\n got %s\nwant %s", got, want)
			}
			if w := strings.Join(req.Warnings, "\n"); (c.warn == "") != (w == "") || !strings.Contains(w, c.warn) {
				t.Errorf("warnings %q, want %q", w, c.warn)
			}
		})
	}
}
