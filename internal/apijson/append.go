package apijson

import (
	"encoding/json"
	"strconv"
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
	quoted := string(b[start:])
	b = b[:start]
	for _, r := range quoted {
		switch r {
		case '<', '>', '&':
			b = append(b, `\u00`...)
			b = strconv.AppendUint(b, uint64(r), 16)
		case '\u2028', '\u2029':
			b = append(b, `\u`...)
			b = strconv.AppendUint(b, uint64(r), 16)
		default:
			b = utf8.AppendRune(b, r)
		}
	}
	return b, nil
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
