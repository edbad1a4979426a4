package hop

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

// What a peer may send is bounded and checked field by field, on both
// ends: the source does not offer, nor the target read, an identity that
// names a network KubeVirt would not, or IPs no claim holds.
func TestIdentityValidate(t *testing.T) {
	ok := blueIdentity("mig-1")
	if err := ok.Validate(); err != nil {
		t.Fatalf("a valid identity: %v", err)
	}
	with := func(f func(*Identity)) Identity {
		id := blueIdentity("mig-1")
		id.Networks = append([]NetworkIdentity{}, id.Networks...)
		id.Networks[0].IPs = append([]netip.Prefix{}, id.Networks[0].IPs...)
		f(&id)
		return id
	}
	many := func(n int) []NetworkIdentity {
		var out []NetworkIdentity
		for i := range n {
			out = append(out, NetworkIdentity{Name: "n" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + string(rune('a'+i/26)), NetworkName: "net"})
		}
		return out
	}
	for want, id := range map[string]Identity{
		"migration ID of 0 bytes":            with(func(id *Identity) { id.MigrationID = "" }),
		"outside printable ASCII":            with(func(id *Identity) { id.MigrationID = "mig 1" }),
		"0 networks":                         with(func(id *Identity) { id.Networks = nil }),
		"33 networks":                        with(func(id *Identity) { id.Networks = many(33) }),
		"networks[0].name: \"Blue\" is not":  with(func(id *Identity) { id.Networks[0].Name = "Blue" }),
		"networks[0].name: \"-blue\" is not": with(func(id *Identity) { id.Networks[0].Name = "-blue" }),
		"networks[1].name: \"blue\" twice":   with(func(id *Identity) { id.Networks = append(id.Networks, NetworkIdentity{Name: "blue", NetworkName: "x"}) }),
		"networks[0].networkName: 0 bytes":   with(func(id *Identity) { id.Networks[0].NetworkName = "" }),
		"networks[0].mac: 4 bytes":           with(func(id *Identity) { id.Networks[0].MAC = net.HardwareAddr{2, 0, 0, 1} }),
		"multicast":                          with(func(id *Identity) { id.Networks[0].MAC = net.HardwareAddr{1, 0, 0x5e, 0, 0, 1} }),
		"networks[0].ips[2]: 10.1.0.5 twice": with(func(id *Identity) {
			id.Networks[0].IPs = append(id.Networks[0].IPs, netip.MustParsePrefix("10.1.0.5/16"))
		}),
		"127.0.0.1/8 is not a unicast":       with(func(id *Identity) { id.Networks[0].IPs[0] = netip.MustParsePrefix("127.0.0.1/8") }),
		"fe80::1/64 is not a unicast":        with(func(id *Identity) { id.Networks[0].IPs[1] = netip.MustParsePrefix("fe80::1/64") }),
		"::ffff:10.1.0.5/120 is not an IPv4": with(func(id *Identity) { id.Networks[0].IPs[0] = netip.MustParsePrefix("::ffff:10.1.0.5/120") }),
		"networks[0].ips: 9, want at most 8": with(func(id *Identity) {
			for i := range 7 {
				id.Networks[0].IPs = append(id.Networks[0].IPs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 2, 0, byte(i + 1)}), 24))
			}
		}),
	} {
		err := id.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error saying %q", err, want)
		}
		if _, err := id.MarshalBinary(); err == nil {
			t.Errorf("%q: an invalid identity encoded", want)
		}
	}
}
