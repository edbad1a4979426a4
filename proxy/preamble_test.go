package proxy

import (
	"bytes"
	"testing"
)

// FuzzReadPreamble: any bytes either decode to a preamble that encodes
// back to exactly the bytes read, or fail; never a panic, and never more
// bytes read than the preamble holds.
func FuzzReadPreamble(f *testing.F) {
	good, _ := Preamble{Mode: ModeTLS, MigrationID: "mig-1", Port: 40001}.MarshalBinary()
	f.Add(good)
	f.Add(append(good, "tail"...))
	f.Add([]byte("KVNPX\x01\x02\x00\x01\x00"))
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
