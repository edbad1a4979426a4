package caexchange

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/certs/certstest"
)

func caAt(t testing.TB, name string, notBefore time.Time, life time.Duration) *x509.Certificate {
	t.Helper()
	ca, err := certs.NewCA(name, notBefore, life)
	if err != nil {
		t.Fatal(err)
	}
	return ca.Cert
}

// selfSignedCA is a CA certificate with the given key usage only.
func selfSignedCA(t testing.TB, name string, usage x509.KeyUsage) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: usage}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pemOf(cs ...*x509.Certificate) string { return string(EncodeCerts(cs)) }

func TestParseCABundle(t *testing.T) {
	a, b := newCA(t, "a"), newCA(t, "b")
	// Dated so that virt-operator, which keeps the newest CAs by NotBefore,
	// would put it first and evict the others'.
	future := caAt(t, "future", time.Now().Add(24*time.Hour), time.Hour)
	expired := caAt(t, "expired", time.Now().Add(-2*time.Hour), time.Hour)
	noSign := selfSignedCA(t, "nosign", x509.KeyUsageDigitalSignature)
	leaf := certstest.New(t, "leaf").Cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(certstest.New(t, "leaf").Cert.Certificate[0]); err != nil {
			t.Fatal(err)
		}
	}
	for name, tc := range map[string]struct {
		in      string
		want    int
		wantErr string
	}{
		"two CAs":                {in: pemOf(a, b), want: 2},
		"whitespace around":      {in: "\n  " + pemOf(a) + "\n\n", want: 1},
		"a duplicate is dropped": {in: pemOf(a, a, b), want: 2},
		"empty":                  {in: "", wantErr: "no certificate"},
		"only whitespace":        {in: " \n", wantErr: "no certificate"},
		"text before":            {in: "my CA\n" + pemOf(a), wantErr: "not PEM before block 0"},
		"text after":             {in: pemOf(a) + "junk", wantErr: "not PEM before block 1"},
		"a key":                  {in: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", wantErr: `"PRIVATE KEY"`},
		"broken PEM":             {in: "-----BEGIN CERTIFICATE-----\n!!!\n", wantErr: "not valid PEM"},
		"not DER":                {in: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", wantErr: "certificate 0"},
		"a leaf":                 {in: pemOf(a, leaf), wantErr: "certificate 1 (subject \"CN=leaf\") is not a CA"},
		"an expired CA":          {in: pemOf(a, expired), wantErr: "certificate 1 (subject \"CN=expired\") is not valid now"},
		"a future-dated CA":      {in: pemOf(future, a), wantErr: "certificate 0 (subject \"CN=future\") is not valid now"},
		"a CA that cannot sign":  {in: pemOf(noSign), wantErr: "no certSign key usage"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := ParseCABundle([]byte(tc.in), time.Now())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != tc.want {
				t.Fatalf("got %d certificates, %v; want %d", len(got), err, tc.want)
			}
		})
	}
}

func TestParseCABundleBounds(t *testing.T) {
	var many []*x509.Certificate
	for range maxBundleCerts + 1 {
		many = append(many, newCA(t, "n"))
	}
	if _, err := ParseCABundle(EncodeCerts(many), time.Now()); err == nil {
		t.Errorf("%d certificates accepted", len(many))
	}
	if _, err := ParseCABundle(EncodeCerts(many[:maxBundleCerts]), time.Now()); err != nil {
		t.Errorf("%d certificates: %v", maxBundleCerts, err)
	}
}

// fps is the fingerprints of the certificates of a bundle, in order.
func fps(data string) []string {
	var out []string
	for _, c := range bundleCerts(data) {
		out = append(out, Fingerprint(c))
	}
	return out
}

func TestExternalCAMerge(t *testing.T) {
	op, a1, a2, c1, x := newCA(t, "operator"), newCA(t, "a1"), newCA(t, "a2"), newCA(t, "c1"), newCA(t, "x")
	fa1, fa2, fc1, fop, fx := Fingerprint(a1), Fingerprint(a2), Fingerprint(c1), Fingerprint(op), Fingerprint(x)
	operator := "# the operator's entry\n" + pemOf(op)
	both := map[string]bool{"a": true, "c": true}
	for name, tc := range map[string]struct {
		u         ExternalCAUpdate
		wantFPs   []string
		wantSlots Slots
		keep      string // a substring that must survive as is
	}{
		"first offer, empty inbox": {
			u:       ExternalCAUpdate{Peer: "a", Want: []*x509.Certificate{a1}, Configured: both},
			wantFPs: []string{fa1}, wantSlots: Slots{"a": {fa1}},
		},
		"merged after the operator's entry, which stays": {
			u:       ExternalCAUpdate{Data: operator, Peer: "a", Want: []*x509.Certificate{a1}, Configured: both},
			wantFPs: []string{fop, fa1}, wantSlots: Slots{"a": {fa1}}, keep: operator,
		},
		"the same offer again changes nothing": {
			u:       ExternalCAUpdate{Data: operator + pemOf(a1), Slots: Slots{"a": {fa1}}, Peer: "a", Want: []*x509.Certificate{a1}, Configured: both},
			wantFPs: []string{fop, fa1}, wantSlots: Slots{"a": {fa1}}, keep: operator + pemOf(a1),
		},
		"rotation replaces the rotated-out CA": {
			u:       ExternalCAUpdate{Data: operator + pemOf(a1), Slots: Slots{"a": {fa1}}, Peer: "a", Want: []*x509.Certificate{a2}, Configured: both},
			wantFPs: []string{fop, fa2}, wantSlots: Slots{"a": {fa2}}, keep: operator,
		},
		"an operator's copy of a peer CA is theirs: not claimed, not duplicated, never removed": {
			u:       ExternalCAUpdate{Data: pemOf(a1), Peer: "a", Want: []*x509.Certificate{a2}, Configured: both},
			wantFPs: []string{fa1, fa2}, wantSlots: Slots{"a": {fa2}},
		},
		"one peer cannot remove another's slot": {
			u:       ExternalCAUpdate{Data: pemOf(c1), Slots: Slots{"c": {fc1}}, Peer: "a", Want: []*x509.Certificate{a1}, Configured: both},
			wantFPs: []string{fc1, fa1}, wantSlots: Slots{"a": {fa1}, "c": {fc1}},
		},
		"a certificate two peers offer stays while one still wants it": {
			u:       ExternalCAUpdate{Data: pemOf(x), Slots: Slots{"a": {fx}, "c": {fx}}, Peer: "a", Want: []*x509.Certificate{a1}, Configured: both},
			wantFPs: []string{fx, fa1}, wantSlots: Slots{"a": {fa1}, "c": {fx}},
		},
		"already trusted by kubevirt-ca: no copy": {
			u:       ExternalCAUpdate{Peer: "a", Want: []*x509.Certificate{a1, a2}, Effective: map[string]bool{fa1: true}, Configured: both},
			wantFPs: []string{fa2}, wantSlots: Slots{"a": {fa2}},
		},
		"the slot of a peer no longer configured is emptied": {
			u:       ExternalCAUpdate{Data: operator + pemOf(c1), Slots: Slots{"c": {fc1}}, Peer: "a", Want: []*x509.Certificate{a1}, Configured: map[string]bool{"a": true}},
			wantFPs: []string{fop, fa1}, wantSlots: Slots{"a": {fa1}}, keep: operator,
		},
		"a slot entry virt-operator already consumed is forgotten": {
			u:       ExternalCAUpdate{Data: "", Slots: Slots{"a": {fa1}}, Peer: "a", Want: []*x509.Certificate{a1}, Effective: map[string]bool{fa1: true}, Configured: both},
			wantFPs: nil, wantSlots: Slots{},
		},
		"no trailing newline in the operator's text": {
			u:       ExternalCAUpdate{Data: strings.TrimSuffix(pemOf(op), "\n"), Peer: "a", Want: []*x509.Certificate{a1}, Configured: both},
			wantFPs: []string{fop, fa1}, wantSlots: Slots{"a": {fa1}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			data, slots := tc.u.Merge()
			if got := fps(data); !slices.Equal(got, tc.wantFPs) {
				t.Errorf("bundle holds %v, want %v\n%s", got, tc.wantFPs, data)
			}
			if slots.Encode() != tc.wantSlots.Encode() {
				t.Errorf("slots %s, want %s", slots.Encode(), tc.wantSlots.Encode())
			}
			if tc.keep != "" && !strings.Contains(data, tc.keep) {
				t.Errorf("the operator's text was changed:\n%s", data)
			}
			// Idempotent: merging the result again changes nothing.
			again := tc.u
			again.Data, again.Slots = data, slots
			if d2, s2 := again.Merge(); d2 != data || s2.Encode() != slots.Encode() {
				t.Errorf("a second merge changed the result:\n%s\n%s", data, d2)
			}
		})
	}
}

func TestDecodeSlotsIgnoresGarbage(t *testing.T) {
	if s := DecodeSlots("{not json"); len(s) != 0 {
		t.Errorf("garbage decoded to %v", s)
	}
	if (Slots{"a": nil}).Encode() != "" {
		t.Error("empty slots encode to an annotation")
	}
}

func TestLocalOfferIsOwnCAsOnly(t *testing.T) {
	own1, own2, peer := newCA(t, "own1"), newCA(t, "own2"), newCA(t, "peer")
	c := &Sync{}
	offer := func(bundle string) []string {
		t.Helper()
		var out []string
		for _, cert := range c.ownOf(bundleCerts(bundle)) {
			out = append(out, Fingerprint(cert))
		}
		return out
	}
	// virt-operator's order: the current CA first, then the rest.
	if got := offer(pemOf(own1, peer)); !slices.Equal(got, []string{Fingerprint(own1)}) {
		t.Errorf("before rotation offered %v, want own1 only", got)
	}
	if got := offer(pemOf(own2, own1, peer)); !slices.Equal(got, []string{Fingerprint(own2), Fingerprint(own1)}) {
		t.Errorf("during the overlap offered %v, want own2 and own1", got)
	}
	if got := offer(pemOf(own2, peer)); !slices.Equal(got, []string{Fingerprint(own2)}) {
		t.Errorf("after the overlap offered %v, want own2 only", got)
	}
	if got := offer(pemOf(own2, own1, peer)); !slices.Equal(got, []string{Fingerprint(own2)}) {
		t.Errorf("a dropped CA came back: offered %v", got)
	}
}

func FuzzParseCABundle(f *testing.F) {
	a := newCA(f, "a")
	f.Add(EncodeCerts([]*x509.Certificate{a}))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("junk"))
	f.Fuzz(func(t *testing.T, b []byte) {
		certs, err := ParseCABundle(b, time.Now())
		if err != nil {
			return
		}
		for _, c := range certs {
			if !c.IsCA {
				t.Fatalf("accepted a certificate that is not a CA: %s", c.Subject)
			}
		}
		again, err := ParseCABundle(EncodeCerts(certs), time.Now())
		if err != nil || len(again) != len(certs) {
			t.Fatalf("re-encoded bundle: %d certificates, %v", len(again), err)
		}
	})
}

// A cluster offers only what its peers take: its valid CAs, current first,
// at most maxBundleCerts of them, so a stale CA in kubevirt-ca never makes
// a peer refuse the whole offer.
func TestOfferableIsWhatPeersTake(t *testing.T) {
	now := time.Now()
	cur, prev := newCA(t, "current"), newCA(t, "previous")
	expired := caAt(t, "expired", now.Add(-2*time.Hour), time.Hour)
	future := caAt(t, "future", now.Add(24*time.Hour), time.Hour)
	got := offerable([]*x509.Certificate{cur, expired, prev, future}, now)
	if len(got) != 2 || got[0] != cur || got[1] != prev {
		t.Fatalf("offered %d certificates, want current and previous", len(got))
	}
	var many []*x509.Certificate
	for range maxBundleCerts + 2 {
		many = append(many, newCA(t, "n"))
	}
	got = offerable(many, now)
	if len(got) != maxBundleCerts || got[0] != many[0] {
		t.Fatalf("offered %d of %d, want the first %d", len(got), len(many), maxBundleCerts)
	}
	if _, err := ParseCABundle(EncodeCerts(got), now); err != nil {
		t.Fatalf("a peer refuses what this cluster offers: %v", err)
	}
}
