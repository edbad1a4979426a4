package apijson

import (
	"encoding/json"
	"slices"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// AppendString appends s quoted as encoding/json quotes it: jsontext's
// quoting, and then what encoding/json escapes beyond JSON's minimum (<,
// >, & for HTML, U+2028 and U+2029 for JavaScript; kvnet's warnings say
// "<= v1.12"). A string that is not UTF-8, which encoding/json repairs its
// own way, is left to it.
func AppendString(b []byte, s string) ([]byte, error) {
	if plain(s) {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"'), nil
	}
	if !utf8.ValidString(s) {
		q, err := json.Marshal(s)
		return append(b, q...), err
	}
	start := len(b)
	b, err := jsontext.AppendQuote(b, s)
	if err != nil || !mayNeedEscape(s) {
		return b, err
	}
	return escapeHTMLInPlace(b, start), nil
}

// escapeHTMLInPlace rewrites the quoted string b[start:] as encoding/json
// writes it: <, > and & as \u003c, \u003e, \u0026, U+2028 and U+2029 as
// \u2028 and \u2029. It grows b once and moves bytes back to front, so
// the string is not copied out first (kvnet's warnings say "<= v1.12",
// and one is in every answer to a VM that keeps allow_live_migration).
func escapeHTMLInPlace(b []byte, start int) []byte {
	extra := 0
	for i := start; i < len(b); i++ {
		switch {
		case b[i] == '<' || b[i] == '>' || b[i] == '&':
			extra += 5 // one byte becomes six
		case isLineOrParagraphSeparator(b, i):
			extra += 3 // three bytes become six
		}
	}
	if extra == 0 {
		return b
	}
	n := len(b)
	b = slices.Grow(b, extra)[:n+extra]
	const hex = "0123456789abcdef"
	w := len(b)
	for r := n - 1; r >= start; r-- {
		switch c := b[r]; {
		case c == '<' || c == '>' || c == '&':
			w -= 6
			copy(b[w:], `\u00`)
			b[w+4], b[w+5] = hex[c>>4], hex[c&0xF]
		case r >= start+2 && isLineOrParagraphSeparator(b, r-2):
			last := "89"[b[r]-0xA8] // read before the write, which may cover it
			w -= 6
			copy(b[w:], `\u202`)
			b[w+5] = last
			r -= 2
		default:
			w--
			b[w] = c
		}
	}
	return b
}

// isLineOrParagraphSeparator reports whether b[i:] starts with the UTF-8
// of U+2028 or U+2029 (E2 80 A8, E2 80 A9).
func isLineOrParagraphSeparator(b []byte, i int) bool {
	return i+2 < len(b) && b[i] == 0xE2 && b[i+1] == 0x80 && (b[i+2] == 0xA8 || b[i+2] == 0xA9)
}

// plain reports whether every byte of s is printable ASCII that
// encoding/json writes as itself (not '"', '\\', '<', '>' or '&'), as
// nearly every string of an answer is: names, paths, MACs, the record's
// words. One pass over a table, where the general path validates UTF-8,
// quotes through jsontext and scans again for what HTML needs escaped.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainByte[s[i]] {
			return false
		}
	}
	return true
}

var plainByte = func() (t [256]bool) {
	for c := ' '; c <= '~'; c++ {
		t[c] = true
	}
	for _, c := range `"\<>&` {
		t[c] = false
	}
	return t
}()

// mayNeedEscape reports whether s may hold what encoding/json escapes
// beyond JSON's minimum: <, >, &, or a character whose UTF-8 starts with
// 0xE2, as U+2028 and U+2029 do (others that do are checked again, one
// rune at a time). strings.ContainsAny with those two in its set walks s
// rune by rune, for every string of every answer.
func mayNeedEscape(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '<', '>', '&', 0xE2:
			return true
		}
	}
	return false
}
