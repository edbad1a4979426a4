package apijson

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// AppendString quotes as encoding/json does: every byte alone, and
// strings mixing plain text with what needs escaping, invalid UTF-8 and
// the JavaScript line separators.
func TestAppendStringIsEncodingJSONs(t *testing.T) {
	var cases []string
	for c := range 256 {
		cases = append(cases, string(rune(c)), string([]byte{byte(c)}), "name-"+string([]byte{byte(c)})+"-x")
	}
	pieces := []string{"a", "tenant-a/ovn", "02:00:00:00:00:01", `"`, `\`, "<", ">", "&", "\n", "\x00", "é", "\u2028", "\u2029", "\xff", "\xe2\x80", "~", " "}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		var s string
		for range r.IntN(6) {
			s += pieces[r.IntN(len(pieces))]
		}
		cases = append(cases, s)
	}
	for _, s := range cases {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := AppendString([]byte("prefix"), s)
		if err != nil || !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("%q: got %s (%v), want %s", s, got, err, want)
		}
	}
}

// FuzzAppendStringIsEncodingJSONs holds AppendString to encoding/json on
// any string, after any prefix (the in-place escaping moves bytes within
// the buffer the prefix starts).
func FuzzAppendStringIsEncodingJSONs(f *testing.F) {
	for _, s := range []string{"", "plain", "<= v1.12 & >= v1.13", "\u2028<\u2029>", "\xe2\x80\xa8\xe2\x80", "é&\"\\\n"} {
		f.Add("prefix", s)
	}
	f.Fuzz(func(t *testing.T, prefix, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		got, err := AppendString([]byte(prefix), s)
		if err != nil || !bytes.Equal(got, append([]byte(prefix), want...)) {
			t.Fatalf("%q: got %q (%v), want %q", s, got, err, want)
		}
	})
}
