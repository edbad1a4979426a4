package hop

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// FuzzReadPreamble: any bytes either decode to a preamble that encodes
// back to exactly the bytes read, or fail; never a panic, and never more
// bytes read than the preamble holds.
func FuzzReadPreamble(f *testing.F) {
	good, _ := Preamble{Mode: ModeTLS, Route: testRoute("mig-1"), Port: 40001}.MarshalBinary()
	f.Add(good)
	f.Add(append(good, "tail"...))
	f.Add([]byte("KVNPX\x02\x02\x00\x01\x05mig-1\x01a\x01b\x01a\x01b"))
	f.Add([]byte("KVNPX\x01\x02\x00\x01\x05mig-1"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		p, err := ReadPreamble(r)
		if err != nil {
			return
		}
		enc, err := p.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", p, err)
		}
		if read := len(b) - r.Len(); !bytes.Equal(enc, b[:read]) {
			t.Fatalf("decoded %+v re-encodes as %x, read %x", p, enc, b[:read])
		}
	})
}

// FuzzReadRequest: the same for both request kinds of the hop (a stream
// preamble, a CA offer): decoded means it encodes back to exactly the
// bytes read, and nothing past the request was read.
func FuzzReadRequest(f *testing.F) {
	stream, _ := Preamble{Mode: ModeAuthenticated, Route: testRoute("mig-1"), Port: 49152}.MarshalBinary()
	offer, _ := CAOffer{Bundle: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")}.MarshalBinary()
	f.Add(stream)
	f.Add(offer)
	f.Add(append(offer, "tail"...))
	f.Add([]byte("KVNCA\x01\x00\x00\x00\x00"))
	f.Add([]byte("KVNCA\x01\xff\xff\xff\xff"))
	f.Add([]byte("KVNCA\x02\x00\x00\x00\x01x"))
	identity, _ := Identity{Route: testRoute("mig-1"), Networks: []NetworkIdentity{
		{Name: "blue", NetworkName: "tenant-blue", MAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}, IPs: []netip.Prefix{netip.MustParsePrefix("10.1.0.5/24"), netip.MustParsePrefix("fd00::5/64")}},
		{Name: "storage", NetworkName: "ns1/storage"},
	}}.MarshalBinary()
	f.Add(identity)
	f.Add(append(identity, "tail"...))
	f.Add([]byte("KVNID\x02\x05mig-1\x01a\x01b\x01a\x01b\xff"))
	f.Add([]byte("KVNID\x02\x05mig-1\x01a\x01b\x01a\x01b\x01\x01a\x01n\x06\x02\x00\x00\x00\x00\x01\x01\x04\x0a\x00\x00\x01\x21"))
	f.Add([]byte("KVNID\x01\x05mig-1\x01\x01a\x01n\x06\x02\x00\x00\x00\x00\x01\x01\x04\x0a\x00\x00\x01\x21"))
	lease, _ := LeaseCheck{Route: testRoute("mig-1")}.MarshalBinary()
	f.Add(lease)
	f.Add(append(lease, "tail"...))
	f.Add([]byte("KVNLS\x01\x05mig-1\x01a\x01b\x01a"))
	f.Add([]byte("KVNLS\x01\x05mig-1\x01a\x01b\x01a\x01B"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bytes.NewReader(b)
		req, err := ReadRequest(r)
		if err != nil {
			return
		}
		enc, err := req.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", req, err)
		}
		if read := len(b) - r.Len(); !bytes.Equal(enc, b[:read]) {
			t.Fatalf("decoded request re-encodes as %x, read %x", enc, b[:read])
		}
	})
}

// A lease check carries its route and nothing else, and reads back as
// written, no byte more; a malformed route is refused naming the field.
func TestLeaseCheckRoundTrip(t *testing.T) {
	q := LeaseCheck{Route: testRoute("mig-7")}
	b, err := q.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	r := bytes.NewReader(append(b, "stream"...))
	req, err := ReadRequest(r)
	if err != nil || req.Lease == nil || req.Lease.Route != q.Route || req.Stream != nil || req.Identity != nil || req.CAOffer != nil {
		t.Fatalf("ReadRequest = %+v, %v; want the lease check back", req, err)
	}
	if r.Len() != len("stream") {
		t.Errorf("read %d bytes past the request", len("stream")-r.Len())
	}
	bad := q
	bad.Target.Name = "Not_A_Name"
	if _, err := bad.MarshalBinary(); err == nil || !strings.Contains(err.Error(), "target.name") {
		t.Errorf("a bad target name: %v, want an error naming target.name", err)
	}
	if got := RefusedNotHeld.String(); got != "identity-not-held" {
		t.Errorf("RefusedNotHeld = %q", got)
	}
}
