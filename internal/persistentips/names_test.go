package persistentips

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestClaimName(t *testing.T) {
	long := strings.Repeat("v", 63) + "." + strings.Repeat("n", 200)
	tests := map[string]struct {
		vm, network string
		want        string // exact name; "" means check shape only
		prefix      string
	}{
		"plain":                 {vm: "web", network: "tenant", want: "web.tenant"},
		"uppercase is hashed":   {vm: "web", network: "Tenant", prefix: "web.tenant-"},
		"underscore is hashed":  {vm: "web", network: "my_net", prefix: "web.my-net-"},
		"too long is shortened": {vm: strings.Repeat("v", 63), network: strings.Repeat("n", 200), prefix: long[:MaxClaimNameLength-hashSuffixLen-1]},
		"only invalid chars":    {vm: "web", network: "___", prefix: "web-"},
		"leading dash label":    {vm: "web", network: "-x", prefix: "web.x-"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := ClaimName(tc.vm, tc.network)
			if msgs := validation.IsDNS1123Subdomain(got); len(msgs) > 0 {
				t.Fatalf("ClaimName(%q, %q) = %q: not a valid name: %v", tc.vm, tc.network, got, msgs)
			}
			if tc.want != "" && got != tc.want {
				t.Fatalf("ClaimName(%q, %q) = %q, want %q", tc.vm, tc.network, got, tc.want)
			}
			if tc.prefix != "" && (!strings.HasPrefix(got, tc.prefix) || len(got) > MaxClaimNameLength) {
				t.Fatalf("ClaimName(%q, %q) = %q, want prefix %q and at most %d chars", tc.vm, tc.network, got, tc.prefix, MaxClaimNameLength)
			}
			if again := ClaimName(tc.vm, tc.network); again != got {
				t.Fatalf("not deterministic: %q then %q", got, again)
			}
		})
	}
}

// Networks that differ only in case are two networks to KubeVirt, so two
// claims and two IPs; already-lowercase names keep their plain form, so
// existing claims keep their names. (Both gave "web.blue" before.)
func TestClaimNameCaseDoesNotShare(t *testing.T) {
	upper, lower := ClaimName("web", "Blue"), ClaimName("web", "blue")
	if upper == lower {
		t.Fatalf("networks Blue and blue share claim %q", upper)
	}
	if lower != "web.blue" {
		t.Fatalf("ClaimName(web, blue) = %q, want the unchanged web.blue", lower)
	}
}

// Shortened names differ when the inputs differ past the cut.
func TestClaimNameNoSharedPrefixCollision(t *testing.T) {
	vm := strings.Repeat("v", 63)
	a := ClaimName(vm, strings.Repeat("n", 200)+"a")
	b := ClaimName(vm, strings.Repeat("n", 200)+"b")
	if a == b {
		t.Fatalf("two networks share claim name %q", a)
	}
}

// The hashed interface names KubeVirt's own tests use for "blue" and "red".
func TestPodInterfaceName(t *testing.T) {
	for network, want := range map[string]string{"blue": "pod16477688c0e", "red": "podb1f51a511f1"} {
		if got := PodInterfaceName(network); got != want {
			t.Errorf("PodInterfaceName(%q) = %q, want %q", network, got, want)
		}
	}
}

func FuzzClaimName(f *testing.F) {
	f.Add("web", "tenant")
	f.Add("Web", "my_net.")
	f.Add(strings.Repeat("a", 253), "..--")
	f.Fuzz(func(t *testing.T, vm, network string) {
		got := ClaimName(vm, network)
		if msgs := validation.IsDNS1123Subdomain(got); len(msgs) > 0 {
			t.Fatalf("ClaimName(%q, %q) = %q: %v", vm, network, got, msgs)
		}
		if got != ClaimName(vm, network) {
			t.Fatal("not deterministic")
		}
	})
}

// ClaimName and ipam-extensions agree exactly on names that are already
// lowercase and valid; everything else gets kvnet's hash suffix.
func TestSameNameAsIPAMExtensions(t *testing.T) {
	for _, c := range []struct {
		vm, network string
		want        bool
	}{
		{"web", "default", true},
		{"web", "my-net", true},
		{"web", "net.a", true},
		{"web", "Blue", false},
		{"web", "my_net", false},
		{"web", "-net", false},
		{"web", strings.Repeat("n", 250), false},
	} {
		if got := SameNameAsIPAMExtensions(c.vm, c.network); got != c.want {
			t.Errorf("SameNameAsIPAMExtensions(%q, %q) = %v, want %v (ClaimName %q)", c.vm, c.network, got, c.want, ClaimName(c.vm, c.network))
		}
	}
}
