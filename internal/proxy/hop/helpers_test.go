package hop

import (
	"net"
	"net/netip"
)

// testRoute is the route of migration id of a VM that keeps its namespace
// and name, for the tests whose resolver knows migrations by ID alone.
func testRoute(id string) Route { return SameVM(id, "tenant", "vm1") }

// blueIdentity is a migration's identity on one dual-stack network.
func blueIdentity(id string) Identity {
	return Identity{Route: testRoute(id), Networks: []NetworkIdentity{
		{Name: "blue", NetworkName: "tenant-blue", MAC: net.HardwareAddr{0x02, 0x00, 0x00, 0x0a, 0x01, 0x05},
			IPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.5/24"), netip.MustParsePrefix("fd00:1::5/64")}},
	}}
}
