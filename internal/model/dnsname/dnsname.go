// Package dnsname checks Kubernetes names (RFC 1123 labels and
// subdomains) with byte loops: the same answers as the API machinery's
// regular expressions (TestAgreesWithTheLibrary), at a fraction of their
// cost, for the names checked on every admission request. On a name they
// refuse, callers ask the library for its messages.
package dnsname

import (
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Label reports whether s is an RFC 1123 label: at most 63 of a-z,
// 0-9 and '-', starting and ending with a letter or digit.
func Label(s string) bool {
	return len(s) <= validation.DNS1123LabelMaxLength && isLabel(s)
}

// Subdomain reports whether s is an RFC 1123 subdomain: at most 253
// characters, labels (of any length) joined by single dots.
func Subdomain(s string) bool {
	if len(s) > validation.DNS1123SubdomainMaxLength {
		return false
	}
	for {
		label, rest, dot := strings.Cut(s, ".")
		if !isLabel(label) {
			return false
		}
		if !dot {
			return true
		}
		s = rest
	}
}

// isLabel: one or more of a-z, 0-9 and '-', not starting or ending with '-'.
func isLabel(s string) bool {
	if s == "" || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}
