package hop

import (
	"fmt"
	"io"
)

// leaseMagic starts a lease check, the hop's fourth request kind: after a
// move, the source cluster keeps the VM's claims as leases of the target
// cluster, and asks the target, now and then, whether the VM the migration
// moved there still exists. Versioned by its last byte, like the other
// magics; a proxy that predates it answers bad-preamble, which the source
// takes as no answer (the lease is kept).
var leaseMagic = [6]byte{'K', 'V', 'N', 'L', 'S', 1}

// LeaseCheck asks whether the receiving VM of a route (Route.Target) still
// holds, in the target cluster, the network identity the migration carried
// there. The verdict is Accepted for yes, RefusedNotHeld for no; any other
// verdict, or none, is no answer.
//
// Wire format, after the magic: route (see appendRoute).
type LeaseCheck struct {
	Route
}

// MarshalBinary encodes q.
func (q LeaseCheck) MarshalBinary() ([]byte, error) {
	if err := q.Route.Validate(); err != nil {
		return nil, fmt.Errorf("lease check: %w", err)
	}
	b := make([]byte, 0, 128)
	b = append(b, leaseMagic[:]...)
	return appendRoute(b, q.Route), nil
}

// readLeaseBody reads what follows a lease check's magic.
func readLeaseBody(r io.Reader) (LeaseCheck, error) {
	rt, err := readRoute(r)
	if err != nil {
		return LeaseCheck{}, fmt.Errorf("lease check: %w", err)
	}
	return LeaseCheck{Route: rt}, nil
}
