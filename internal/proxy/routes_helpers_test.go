package proxy

import (
	"net"
	"net/netip"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// testRoute is the route of migration id of a VM that keeps its namespace
// and name, for the tests whose resolver knows migrations by ID alone.
func testRoute(id string) hop.Route { return hop.SameVM(id, "tenant", "vm1") }

// blueIdentity is a migration's identity on one dual-stack network.
func blueIdentity(id string) hop.Identity {
	return hop.Identity{Route: testRoute(id), Networks: []hop.NetworkIdentity{
		{Name: "blue", NetworkName: "tenant-blue", MAC: net.HardwareAddr{0x02, 0x00, 0x00, 0x0a, 0x01, 0x05},
			IPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.5/24"), netip.MustParsePrefix("fd00:1::5/64")}},
	}}
}
