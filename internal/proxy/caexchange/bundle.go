package caexchange

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// maxBundleCerts bounds the certificates of one offered bundle. A cluster
// offers its current KubeVirt CA and, during a rotation's overlap, the
// previous one; a few more is slack. Not KubeVirt's own 50: virt-operator
// keeps the 50 newest CAs by NotBefore in kubevirt-ca, so a peer allowed
// 50 could evict every other peer's CAs (and the root of all of KubeVirt's
// internal mTLS is what it would be writing).
const maxBundleCerts = 4

// clockSkew is how far in the future a CA's NotBefore may lie and still
// be taken: clusters' clocks differ a little.
const clockSkew = 5 * time.Minute

// Fingerprint names a certificate in kvnet's bookkeeping: the hex SHA-256
// of its DER, the hash virt-operator also deduplicates bundles by.
func Fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:])
}

// ParseCABundle is the receiver's check of a peer's offered bundle: PEM
// CERTIFICATE blocks and nothing else but whitespace, each an X.509 CA
// CA certificate (BasicConstraints CA, key usage certSign) valid at now
// (NotBefore at most clockSkew ahead), 1 to maxBundleCerts of them.
// Anything else refuses the whole bundle: a
// peer that sends garbage or a leaf certificate is misconfigured or
// hostile, and half of its bundle is not worth trusting. Duplicates are
// dropped.
func ParseCABundle(b []byte, now time.Time) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	seen := map[string]bool{}
	for i := 0; ; i++ {
		b = bytes.TrimLeft(b, " \t\r\n")
		if len(b) == 0 {
			break
		}
		if !bytes.HasPrefix(b, []byte("-----BEGIN ")) {
			return nil, fmt.Errorf("CA bundle: bytes that are not PEM before block %d", i)
		}
		block, rest := pem.Decode(b)
		if block == nil {
			return nil, fmt.Errorf("CA bundle: block %d is not valid PEM", i)
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			return nil, fmt.Errorf("CA bundle: block %d is a %q, want a plain CERTIFICATE", i, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: certificate %d: %w", i, err)
		}
		if !c.BasicConstraintsValid || !c.IsCA {
			return nil, fmt.Errorf("CA bundle: certificate %d (subject %q) is not a CA", i, c.Subject.String())
		}
		if c.KeyUsage&x509.KeyUsageCertSign == 0 {
			return nil, fmt.Errorf("CA bundle: certificate %d (subject %q) may not sign certificates (no certSign key usage)", i, c.Subject.String())
		}
		if !usableAt(c, now) {
			return nil, fmt.Errorf("CA bundle: certificate %d (subject %q) is not valid now: valid from %s to %s", i, c.Subject.String(),
				c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
		}
		if fp := Fingerprint(c); !seen[fp] {
			seen[fp] = true
			out = append(out, c)
		}
		if len(out) > maxBundleCerts {
			return nil, fmt.Errorf("CA bundle: more than %d certificates", maxBundleCerts)
		}
		b = rest
	}
	if len(out) == 0 {
		return nil, errors.New("CA bundle: no certificate")
	}
	return out, nil
}

// usableAt reports whether CA c may be offered and taken at now: not
// expired, and not dated (beyond clockSkew) in the future, which would put
// it ahead of every other CA in virt-operator's newest-first bundle.
func usableAt(c *x509.Certificate, now time.Time) bool {
	return !now.After(c.NotAfter) && !c.NotBefore.After(now.Add(clockSkew))
}

// EncodeCerts is the PEM of certs, in order.
func EncodeCerts(certs []*x509.Certificate) []byte {
	var b []byte
	for _, c := range certs {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return b
}

// pemSpan is one PEM block of a bundle as text: its byte range and, for a
// certificate that parses, its fingerprint.
type pemSpan struct {
	start, end int
	fp         string
}

// spans splits a bundle someone else may have written into its blocks,
// keeping everything between them where it is.
func spans(data string) []pemSpan {
	var out []pemSpan
	rest, pos := []byte(data), 0
	for {
		block, r := pem.Decode(rest)
		if block == nil {
			return out
		}
		consumed := len(rest) - len(r)
		s := pemSpan{start: pos + bytes.LastIndex(rest[:consumed], []byte("-----BEGIN")), end: pos + consumed}
		if block.Type == "CERTIFICATE" {
			if c, err := x509.ParseCertificate(block.Bytes); err == nil {
				s.fp = Fingerprint(c)
			}
		}
		out = append(out, s)
		rest, pos = r, pos+consumed
	}
}

// bundleCerts is every certificate of a bundle that parses, in order,
// skipping what does not: the local kubevirt-ca is virt-operator's, read
// as it is.
func bundleCerts(data string) []*x509.Certificate {
	var out []*x509.Certificate
	rest := []byte(data)
	for {
		block, r := pem.Decode(rest)
		if block == nil {
			return out
		}
		if block.Type == "CERTIFICATE" {
			if c, err := x509.ParseCertificate(block.Bytes); err == nil {
				out = append(out, c)
			}
		}
		rest = r
	}
}

// AnnotationExternalCAPeers, on kubevirt-external-ca, records which
// certificates of its bundle kvnet wrote for which peer: JSON
// {"<peer>": ["<fingerprint>", ...]}. Everything not listed is someone
// else's (an operator's), and kvnet never removes it. virt-operator
// replaces the whole object when it consumes the bundle, annotation and
// data together, so the record and the data never disagree.
const AnnotationExternalCAPeers = "kvnet.io/external-ca-peers"

// Slots is the decoded AnnotationExternalCAPeers.
type Slots map[string][]string

// DecodeSlots reads the annotation; a value kvnet cannot read claims
// nothing, so kvnet then treats every entry as an operator's.
func DecodeSlots(s string) Slots {
	var out Slots
	if s == "" || json.Unmarshal([]byte(s), &out) != nil {
		return Slots{}
	}
	return out
}

// Encode is the annotation's value; "" for no slot.
func (s Slots) Encode() string {
	clean := Slots{}
	for p, fps := range s {
		if len(fps) > 0 {
			clean[p] = slices.Sorted(slices.Values(fps))
		}
	}
	if len(clean) == 0 {
		return ""
	}
	b, _ := json.Marshal(clean) // a map of string slices always marshals
	return string(b)
}

// ExternalCAUpdate is one peer's bundle to merge into kubevirt-external-ca.
type ExternalCAUpdate struct {
	// Data is the ConfigMap's ca-bundle now; Slots its annotation.
	Data  string
	Slots Slots
	// Peer sent Want, its KubeVirt CAs as of now (already checked).
	Peer string
	Want []*x509.Certificate
	// Effective are the fingerprints this cluster's KubeVirt already
	// trusts (its kubevirt-ca bundle): virt-operator moves what it finds
	// in kubevirt-external-ca there and empties it, so what it holds
	// needs no second copy.
	Effective map[string]bool
	// Configured are the peers of this proxy: a slot of any other name (a
	// peer since removed from --peers) is emptied.
	Configured map[string]bool
}

// Merge returns kubevirt-external-ca's new ca-bundle and annotation: Peer's
// slot holds what it wants and this cluster does not trust yet, its
// rotated-out certificates are cut out, slots of peers no longer
// configured are emptied, and every byte that is in no slot (an
// operator's entries, comments, whatever else) stays where it was.
func (u ExternalCAUpdate) Merge() (data string, slots Slots) {
	sp := spans(u.Data)
	present := map[string]bool{}
	for _, s := range sp {
		if s.fp != "" {
			present[s.fp] = true
		}
	}
	want := map[string]*x509.Certificate{}
	for _, c := range u.Want {
		want[Fingerprint(c)] = c
	}
	// Claims of configured peers on certificates still in the data.
	slots = Slots{}
	owners := map[string]int{}
	claimed := map[string]bool{} // in any slot, configured or not
	for p, fps := range u.Slots {
		for _, fp := range fps {
			if !present[fp] {
				continue
			}
			claimed[fp] = true
			if !u.Configured[p] || (p == u.Peer && want[fp] == nil) {
				continue
			}
			slots[p] = append(slots[p], fp)
			owners[fp]++
		}
	}
	// Cut out what kvnet wrote and no configured peer wants any more.
	var b strings.Builder
	last := 0
	for _, s := range sp {
		if s.fp == "" || !claimed[s.fp] || owners[s.fp] > 0 {
			continue
		}
		b.WriteString(u.Data[last:s.start])
		last = s.end
	}
	b.WriteString(u.Data[last:])
	data = b.String()
	// Add what Peer wants that nobody holds yet, in its order.
	mine := map[string]bool{}
	for _, fp := range slots[u.Peer] {
		mine[fp] = true
	}
	for _, c := range u.Want {
		fp := Fingerprint(c)
		kept := present[fp] && (!claimed[fp] || owners[fp] > 0)
		switch {
		case mine[fp]:
		case kept && owners[fp] > 0:
			slots[u.Peer] = append(slots[u.Peer], fp) // another peer's copy, now shared
			mine[fp] = true
		case kept:
			// An operator put it there: theirs, not claimed, not copied.
		case u.Effective[fp]:
			// Already trusted by KubeVirt.
		default:
			if data != "" && !strings.HasSuffix(data, "\n") {
				data += "\n"
			}
			data += string(EncodeCerts([]*x509.Certificate{c}))
			slots[u.Peer] = append(slots[u.Peer], fp)
			mine[fp] = true
		}
	}
	for p := range maps.Keys(slots) {
		if len(slots[p]) == 0 {
			delete(slots, p)
		}
	}
	return data, slots
}
