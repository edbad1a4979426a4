package hop

import (
	"bytes"
	"strings"
	"testing"
)

// A stream and an identity name whose they are; the version that named a
// migration ID alone is refused, so no peer falls back to it.
func TestHopRequestsCarryTheRoute(t *testing.T) {
	rt := Route{MigrationID: "mig-1", Source: VMRef{"team-a", "db"}, Target: VMRef{"team-a-prod", "db-1"}}
	pre, err := Preamble{Mode: ModeTLS, Route: rt, Port: 49152}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	id := blueIdentity("mig-1")
	id.Route = rt
	ident, err := id.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"stream": pre, "identity": ident} {
		req, err := ReadRequest(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got Route
		switch {
		case req.Stream != nil:
			got = req.Stream.Route
		case req.Identity != nil:
			got = req.Identity.Route
		}
		if got != rt {
			t.Errorf("%s: read route %+v, sent %+v", name, got, rt)
		}
		old := append([]byte{}, b...)
		old[5] = 1 // version 1: the migration ID alone
		if _, err := ReadRequest(bytes.NewReader(old)); err == nil || !strings.Contains(err.Error(), "bad magic") {
			t.Errorf("%s of version 1: got %v, want bad magic", name, err)
		}
	}
}

func TestRouteValidate(t *testing.T) {
	ok := SameVM("mig-1", "team-a", "db")
	for want, rt := range map[string]Route{
		"migration ID of 0 bytes":     {Source: ok.Source, Target: ok.Target},
		"source.namespace \"\"":       {MigrationID: "m", Target: ok.Target},
		"source.namespace \"Team-A\"": {MigrationID: "m", Source: VMRef{"Team-A", "db"}, Target: ok.Target},
		"target.name \"db/x\"":        {MigrationID: "m", Source: ok.Source, Target: VMRef{"team-a", "db/x"}},
	} {
		if err := rt.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: got %v, want an error saying %q", rt, err, want)
		}
		if _, err := (Preamble{Mode: ModeTLS, Route: rt, Port: 1}).MarshalBinary(); err == nil {
			t.Errorf("%+v: an invalid route encoded", rt)
		}
	}
}
