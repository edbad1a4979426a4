package app

import (
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// Each step of `kvnet proxy`'s flags refuses its bad value naming the
// flag, and the steps together give the options the manager is built
// with.
func TestProxyFlagSteps(t *testing.T) {
	good := func() proxyFlags {
		f := proxyFlags{mode: "tls", modes: "tls,authenticated", sources: []string{"10.0.0.0/24"}}
		f.o.AdvertiseAddress = "10.0.0.5"
		return f
	}
	o, err := func() (ProxyOptions, error) { f := good(); return f.options() }()
	if err != nil {
		t.Fatal(err)
	}
	if o.Mode != hop.ModeTLS || len(o.Modes) != 2 || len(o.AllowedSources) != 1 || o.AllowedSources[0].String() != "10.0.0.0/24" || o.Peers != nil {
		t.Errorf("options %+v", o)
	}
	for name, c := range map[string]struct {
		change func(*proxyFlags)
		flag   string
	}{
		"advertise address not an IP":    {func(f *proxyFlags) { f.o.AdvertiseAddress = "node-a" }, "--advertise-address"},
		"no such advertise interface":    {func(f *proxyFlags) { f.o.AdvertiseAddress, f.advertiseIf = "", "kvnet-nosuch0" }, "--advertise-interface"},
		"unknown mode":                   {func(f *proxyFlags) { f.mode = "plain" }, "--mode"},
		"unknown accepted mode":          {func(f *proxyFlags) { f.modes = "tls,plain" }, "--accept-modes"},
		"no allowed sources":             {func(f *proxyFlags) { f.sources = nil }, "--allowed-sources"},
		"allowed source not a CIDR":      {func(f *proxyFlags) { f.sources = []string{"10.0.0.1"} }, "--allowed-sources"},
		"peers file that does not exist": {func(f *proxyFlags) { f.peersFile = t.TempDir() + "/peers.yaml" }, "peers"},
	} {
		f := good()
		c.change(&f)
		if _, err := f.options(); err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%s: err %v, want one naming %s", name, err, c.flag)
		}
	}
}
