package multus

import (
	"net/netip"
	"slices"
	"testing"
)

// A network-status entry gives its NAD with or without a namespace and
// its addresses with or without a prefix length (Multus writes them
// bare); an entry that is neither is no address.
func TestParseNetworkStatus(t *testing.T) {
	got, err := ParseNetworkStatus(`[{"name":"ovn-kubernetes","ips":["10.244.0.8"],"default":true},{"name":"tenant/blue","interface":"net1","ips":["10.100.0.8","fd00::8/64","bogus"],"mac":"02:00:00:00:00:08"},{"name":"red"}]`)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !got[0].Default || got[1].MAC != "02:00:00:00:00:08" {
		t.Fatalf("parsed %+v", got)
	}
	if a := got[1].Addrs(); !slices.Equal(a, []netip.Addr{netip.MustParseAddr("10.100.0.8"), netip.MustParseAddr("fd00::8")}) {
		t.Errorf("addresses %v", a)
	}
	if ns, n := got[1].NAD("pods"); ns != "tenant" || n != "blue" {
		t.Errorf("NAD %s/%s, want tenant/blue", ns, n)
	}
	if ns, n := got[2].NAD("pods"); ns != "pods" || n != "red" {
		t.Errorf("NAD %s/%s, want pods/red", ns, n)
	}
	if _, err := ParseNetworkStatus(`{"name":"x"}`); err == nil {
		t.Error("an object, not a list, parsed")
	}
}
