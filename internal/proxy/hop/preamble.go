package hop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// Mode is how the hop between two proxies carries a stream after the
// mutual-TLS handshake and the preamble.
type Mode byte

const (
	// ModeTLS encrypts the whole stream between the proxies. It is safe
	// whatever KubeVirt's own migration TLS setting is.
	ModeTLS Mode = 1
	// ModeAuthenticated authenticates both proxies and the preamble with
	// mutual TLS, then carries plain bytes so that both proxies splice. It
	// is safe only while KubeVirt's migration TLS is on (the default:
	// migrations.disableTLS false), which then protects the payload inside.
	ModeAuthenticated Mode = 2
)

func (m Mode) String() string {
	switch m {
	case ModeTLS:
		return "tls"
	case ModeAuthenticated:
		return "authenticated"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode reads a mode's name.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "tls":
		return ModeTLS, nil
	case "authenticated":
		return ModeAuthenticated, nil
	}
	return 0, fmt.Errorf("unknown hop mode %q: want tls or authenticated", s)
}

// preambleMagic starts every preamble: a stream from something that is not
// a kvnet proxy fails on the first bytes. Version 2 carries the route (the
// sending and the receiving VM), version 1 only the migration ID; a
// version-1 preamble is refused as bad-preamble, because an ID alone does
// not say whose a stream is (see Route).
var preambleMagic = [6]byte{'K', 'V', 'N', 'P', 'X', 2}

// Preamble is what the source proxy sends right after the handshake: the
// migration and the target's remote port the stream belongs to, and the
// mode of the rest of the stream.
//
// Wire format: magic (6) | mode (1) | port (2, big endian) | route (see
// appendRoute).
type Preamble struct {
	Mode Mode
	Route
	Port uint16
}

// MarshalBinary encodes p.
func (p Preamble) MarshalBinary() ([]byte, error) {
	if err := p.Route.Validate(); err != nil {
		return nil, fmt.Errorf("preamble: %w", err)
	}
	b := make([]byte, 0, 128)
	b = append(b, preambleMagic[:]...)
	b = append(b, byte(p.Mode))
	b = binary.BigEndian.AppendUint16(b, p.Port)
	return appendRoute(b, p.Route), nil
}

// ReadPreamble reads exactly one preamble from r and no byte more, so the
// stream that follows is untouched.
func ReadPreamble(r io.Reader) (Preamble, error) {
	var magic [len(preambleMagic)]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return Preamble{}, fmt.Errorf("preamble: %w", err)
	}
	if magic != preambleMagic {
		return Preamble{}, errors.New("preamble: not a kvnet proxy preamble (bad magic)")
	}
	return readPreambleBody(r)
}

// readPreambleBody reads what follows the stream preamble's magic.
func readPreambleBody(r io.Reader) (Preamble, error) {
	var head [3]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return Preamble{}, fmt.Errorf("preamble: %w", err)
	}
	p := Preamble{Mode: Mode(head[0]), Port: binary.BigEndian.Uint16(head[1:3])}
	if p.Mode != ModeTLS && p.Mode != ModeAuthenticated {
		return Preamble{}, fmt.Errorf("preamble: unknown mode %d", head[0])
	}
	if p.Port == 0 {
		return Preamble{}, errors.New("preamble: port 0")
	}
	rt, err := readRoute(r)
	if err != nil {
		return Preamble{}, fmt.Errorf("preamble: %w", err)
	}
	p.Route = rt
	return p, nil
}

// RefusalCode is why a target proxy refused a stream; it is the metric label
// and travels back in the verdict.
type RefusalCode byte

const (
	// Accepted is the verdict of a request taken; it is no refusal.
	Accepted RefusalCode = iota
	RefusedBadPreamble
	RefusedMode
	RefusedUnknownMigration
	RefusedPort
	RefusedOtherPeer
	RefusedOverCap
	RefusedTargetUnreachable
	RefusedNoCertificate
	RefusedUntrustedPeer
	RefusedHandshake
	RefusedSourceRange
	RefusedLookup
	RefusedBadCABundle
	RefusedCAExchangeOff
	RefusedCAStore
	RefusedTooManyHandshakes
	RefusedBadPorts
	RefusedAmbiguousMigration
	RefusedTargetNotHandler
	RefusedNamespaceShare
	RefusedTooManyConnections
	RefusedHandshakeRate
	RefusedCAOfferRate
	RefusedIdentityOff
	RefusedIdentityMismatch
	RefusedIdentityLate
	RefusedIdentityStore
	RefusedWrongVM
	RefusedIdentityHeld
	// RefusedNotHeld answers a lease check: the receiving VM is gone.
	RefusedNotHeld
)

var refusalNames = map[RefusalCode]string{
	RefusedBadPreamble:        "bad-preamble",
	RefusedMode:               "mode-not-allowed",
	RefusedUnknownMigration:   "unknown-migration",
	RefusedPort:               "port-not-announced",
	RefusedOtherPeer:          "migration-bound-to-other-peer",
	RefusedOverCap:            "over-cap",
	RefusedTargetUnreachable:  "target-unreachable",
	RefusedNoCertificate:      "no-certificate",
	RefusedUntrustedPeer:      "untrusted-peer",
	RefusedHandshake:          "handshake-failed",
	RefusedSourceRange:        "source-not-allowed",
	RefusedLookup:             "lookup-failed",
	RefusedBadCABundle:        "bad-ca-bundle",
	RefusedCAExchangeOff:      "ca-exchange-off",
	RefusedCAStore:            "ca-store-failed",
	RefusedTooManyHandshakes:  "too-many-handshakes",
	RefusedBadPorts:           "ports-not-kubevirts",
	RefusedAmbiguousMigration: "ambiguous-migration",
	RefusedTargetNotHandler:   "target-not-a-virt-handler",
	RefusedNamespaceShare:     "namespace-over-share",
	RefusedTooManyConnections: "too-many-connections",
	RefusedHandshakeRate:      "handshake-rate",
	RefusedCAOfferRate:        "ca-offer-rate",
	RefusedIdentityOff:        "identity-exchange-off",
	RefusedIdentityMismatch:   "identity-mismatch",
	RefusedIdentityLate:       "identity-after-target-pod",
	RefusedIdentityStore:      "identity-store-failed",
	RefusedWrongVM:            "wrong-namespace-or-vm",
	RefusedIdentityHeld:       "identity-held",
	RefusedNotHeld:            "identity-not-held",
}

// RefusalCodes are every refusal there is, for a metric's labels to
// exist before the first of each.
func RefusalCodes() []RefusalCode {
	out := make([]RefusalCode, 0, len(refusalNames))
	for r := range refusalNames {
		out = append(out, r)
	}
	return out
}

func (r RefusalCode) String() string {
	if s, ok := refusalNames[r]; ok {
		return s
	}
	return "refusal(" + strconv.Itoa(int(r)) + ")"
}

// RefusedError is what the source side sees when its peer refused a stream.
type RefusedError struct{ Reason RefusalCode }

func (e *RefusedError) Error() string {
	return "the peer proxy refused the stream: " + e.Reason.String()
}

// ReadVerdict reads a peer's answer to a request.
//
// The verdict is one byte: 0 accepted, else the Refusal. In tls mode it
// travels inside TLS; in authenticated mode it is the first plain byte, so
// that the source's TLS layer never reads (and buffers) past it.
func ReadVerdict(r io.Reader) error {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return fmt.Errorf("reading the peer proxy's verdict: %w", err)
	}
	if RefusalCode(b[0]) != Accepted {
		return &RefusedError{Reason: RefusalCode(b[0])}
	}
	return nil
}
