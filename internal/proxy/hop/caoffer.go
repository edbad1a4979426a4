package hop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// caOfferMagic starts a CA bundle offer, the hop's second request kind (the
// first is the stream Preamble). A magic of its own, versioned by its last
// byte like preambleMagic, rather than a new mode value: a proxy that
// predates the exchange reads it as a bad preamble and closes the
// connection without relaying anything, and the stream preamble's bytes
// stay what they were.
var caOfferMagic = [6]byte{'K', 'V', 'N', 'C', 'A', 1}

// MaxCABundle bounds an offered bundle: KubeVirt keeps at most 50
// certificates in its own bundle, about 40 KiB of PEM.
const MaxCABundle = 64 << 10

// CAOffer is what a proxy sends a peer to hand it this cluster's KubeVirt
// CA bundle: PEM certificates, checked by the receiver (ParseCABundle)
// before anything is stored. The answer is one verdict byte inside TLS,
// sent after the receiver has stored the bundle (or failed to).
//
// Wire format: magic (6) | bundle length (4, big endian) | bundle.
type CAOffer struct {
	Bundle []byte
}

// MarshalBinary encodes o.
func (o CAOffer) MarshalBinary() ([]byte, error) {
	if len(o.Bundle) == 0 || len(o.Bundle) > MaxCABundle {
		return nil, fmt.Errorf("CA offer: bundle of %d bytes, want 1-%d", len(o.Bundle), MaxCABundle)
	}
	b := make([]byte, 0, len(caOfferMagic)+4+len(o.Bundle))
	b = append(b, caOfferMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(o.Bundle)))
	return append(b, o.Bundle...), nil
}

func readCAOfferBody(r io.Reader) (CAOffer, error) {
	var head [4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return CAOffer{}, fmt.Errorf("CA offer: %w", err)
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == 0 || n > MaxCABundle {
		return CAOffer{}, fmt.Errorf("CA offer: bundle of %d bytes, want 1-%d", n, MaxCABundle)
	}
	o := CAOffer{Bundle: make([]byte, n)}
	if _, err := io.ReadFull(r, o.Bundle); err != nil {
		return CAOffer{}, fmt.Errorf("CA offer: bundle: %w", err)
	}
	return o, nil
}

// Request is one request read off the hop: exactly one of Stream,
// CAOffer and Identity is set.
type Request struct {
	Stream   *Preamble
	CAOffer  *CAOffer
	Identity *Identity
	// Lease is a lease check (LeaseCheck).
	Lease *LeaseCheck
}

// ReadRequest reads one hop request of either kind from r and no byte
// more, so that a stream that follows a preamble is untouched.
func ReadRequest(r io.Reader) (Request, error) {
	var magic [len(preambleMagic)]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return Request{}, fmt.Errorf("hop request: %w", err)
	}
	switch magic {
	case preambleMagic:
		p, err := readPreambleBody(r)
		if err != nil {
			return Request{}, err
		}
		return Request{Stream: &p}, nil
	case caOfferMagic:
		o, err := readCAOfferBody(r)
		if err != nil {
			return Request{}, err
		}
		return Request{CAOffer: &o}, nil
	case identityMagic:
		id, err := readIdentityBody(r)
		if err != nil {
			return Request{}, err
		}
		return Request{Identity: &id}, nil
	case leaseMagic:
		q, err := readLeaseBody(r)
		if err != nil {
			return Request{}, err
		}
		return Request{Lease: &q}, nil
	}
	return Request{}, errors.New("hop request: not a kvnet proxy request (bad magic)")
}

// MarshalBinary encodes whichever request r holds.
func (r Request) MarshalBinary() ([]byte, error) {
	set := 0
	for _, ok := range []bool{r.Stream != nil, r.CAOffer != nil, r.Identity != nil, r.Lease != nil} {
		if ok {
			set++
		}
	}
	switch {
	case set != 1:
	case r.Stream != nil:
		return r.Stream.MarshalBinary()
	case r.CAOffer != nil:
		return r.CAOffer.MarshalBinary()
	case r.Identity != nil:
		return r.Identity.MarshalBinary()
	case r.Lease != nil:
		return r.Lease.MarshalBinary()
	}
	return nil, errors.New("hop request: want exactly one of a stream preamble, a CA offer, an identity and a lease check")
}
