package dnsname

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The byte checks accept exactly what the library's regular
// expressions accept.
func TestAgreesWithTheLibrary(t *testing.T) {
	cases := []string{"", "a", "-", "a-", "-a", "a-b", "ab.cd", "a..b", ".a", "a.", "A", "a_b", "a.b-c.d",
		"0", "9a", "a.-b", "a-.b", "é", strings.Repeat("a", 63), strings.Repeat("a", 64),
		strings.Repeat("a", 100) + ".b", strings.Repeat("a.", 126) + "a", strings.Repeat("a.", 127) + "a"}
	for _, s := range cases {
		if got, want := Label(s), len(validation.IsDNS1123Label(s)) == 0; got != want {
			t.Errorf("Label(%q) = %v, library says %v", s, got, want)
		}
		if got, want := Subdomain(s), len(validation.IsDNS1123Subdomain(s)) == 0; got != want {
			t.Errorf("Subdomain(%q) = %v, library says %v", s, got, want)
		}
	}
}
