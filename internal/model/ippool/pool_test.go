package ippool

import (
	"errors"
	"math/big"
	"net/netip"
	"testing"
)

func TestNew(t *testing.T) {
	tests := map[string]struct {
		cidr         string
		ranges, excl []string
		size         string
		in, out      []string
		field        string // expected FieldError field, "" for success
		index        int
	}{
		"ipv4 whole cidr skips network and broadcast": {cidr: "10.0.0.0/24", size: "254", in: []string{"10.0.0.1", "10.0.0.254"}, out: []string{"10.0.0.0", "10.0.0.255"}},
		"ipv4 /31 keeps both":                         {cidr: "10.0.0.0/31", size: "2", in: []string{"10.0.0.0", "10.0.0.1"}},
		"ranges and exclusions": {
			cidr: "10.0.0.0/24", ranges: []string{"10.0.0.10-10.0.0.19", "10.0.0.100/30"}, excl: []string{"10.0.0.12", "10.0.0.15-10.0.0.16", "10.0.0.102/31"},
			size: "9", in: []string{"10.0.0.10", "10.0.0.19", "10.0.0.101"}, out: []string{"10.0.0.12", "10.0.0.16", "10.0.0.102", "10.0.0.103", "10.0.0.20"},
		},
		"overlapping ranges merge": {cidr: "10.0.0.0/24", ranges: []string{"10.0.0.10-10.0.0.20", "10.0.0.15-10.0.0.25"}, size: "16"},
		"ipv6 skips the anycast address": {
			cidr: "fd00::/120", excl: []string{"fd00::1-fd00::f"}, size: "240", in: []string{"fd00::10", "fd00::ff"}, out: []string{"fd00::", "fd00::5"},
		},
		"ipv6 /64 is sized exactly": {cidr: "fd00:1:2:3::/64", size: "18446744073709551615"},
		"ipv6 /48 beyond uint64":    {cidr: "fd00:1::/48", size: "1208925819614629174706175"},
		"bad cidr":                  {cidr: "10.0.0.0/33", field: "cidr", index: -1},
		"host bits":                 {cidr: "10.0.0.1/24", field: "cidr", index: -1},
		"range outside":             {cidr: "10.0.0.0/24", ranges: []string{"10.0.0.1", "10.0.1.1"}, field: "ranges", index: 1},
		"range backwards":           {cidr: "10.0.0.0/24", ranges: []string{"10.0.0.9-10.0.0.1"}, field: "ranges", index: 0},
		"range mixed family":        {cidr: "10.0.0.0/24", ranges: []string{"10.0.0.1-fd00::1"}, field: "ranges", index: 0},
		"exclude garbage":           {cidr: "10.0.0.0/24", excl: []string{"10.0.0.1", "nope"}, field: "exclude", index: 1},
		"exclude other family":      {cidr: "10.0.0.0/24", excl: []string{"fd00::1"}, field: "exclude", index: 0},
		"everything excluded":       {cidr: "10.0.0.0/30", excl: []string{"10.0.0.0/30"}, size: "0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := New(tc.cidr, tc.ranges, tc.excl)
			if tc.field != "" {
				var fe *FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field || fe.Index != tc.index {
					t.Fatalf("err = %v, want a FieldError at %s[%d]", err, tc.field, tc.index)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.size != "" && p.Size().String() != tc.size {
				t.Errorf("size = %s, want %s", p.Size(), tc.size)
			}
			for _, s := range tc.in {
				if !p.Contains(netip.MustParseAddr(s)) {
					t.Errorf("%s should be in the pool", s)
				}
			}
			for _, s := range tc.out {
				if p.Contains(netip.MustParseAddr(s)) {
					t.Errorf("%s should not be in the pool", s)
				}
			}
		})
	}
}

func TestFromList(t *testing.T) {
	p, err := FromList([]string{"192.168.5.12/24", "192.168.5.10/24", "192.168.6.1/30"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Size().Int64() != 3 || p.CIDR(netip.MustParseAddr("192.168.6.1")) != "192.168.6.1/30" {
		t.Fatalf("size %s, cidr %s", p.Size(), p.CIDR(netip.MustParseAddr("192.168.6.1")))
	}
	for name, list := range map[string][]string{
		"no prefix": {"192.168.5.10"},
		"duplicate": {"192.168.5.10/24", "192.168.5.10/25"},
		"mixed":     {"192.168.5.10/24", "fd00::5/64"},
		"network":   {"192.168.5.0/24"},
		"broadcast": {"192.168.5.255/24"},
	} {
		if _, err := FromList(list); err == nil {
			t.Errorf("%s: %v accepted", name, list)
		}
	}
}

// Walk visits every address exactly once from any offset, wrapping across
// ranges, so a full pool is detected and no address is skipped.
func TestWalkVisitsEachOnce(t *testing.T) {
	p, err := New("10.0.0.0/24", []string{"10.0.0.10-10.0.0.14", "10.0.0.200-10.0.0.202"}, []string{"10.0.0.12"})
	if err != nil {
		t.Fatal(err)
	}
	for start := int64(0); start < 20; start++ {
		seen := map[netip.Addr]int{}
		var first netip.Addr
		p.Walk(big.NewInt(start), func(a netip.Addr) bool {
			if !first.IsValid() {
				first = a
			}
			seen[a]++
			return true
		})
		if len(seen) != 7 {
			t.Fatalf("start %d: visited %d addresses, want 7", start, len(seen))
		}
		for a, n := range seen {
			if n != 1 || !p.Contains(a) {
				t.Fatalf("start %d: %s visited %d times (in pool: %v)", start, a, n, p.Contains(a))
			}
		}
	}
	var got netip.Addr
	p.Walk(big.NewInt(4), func(a netip.Addr) bool { got = a; return false })
	if got != netip.MustParseAddr("10.0.0.200") {
		t.Fatalf("offset 4 is %s, want 10.0.0.200 (10-14 minus 12 are offsets 0-3)", got)
	}
}

func TestOverlaps(t *testing.T) {
	a, _ := New("10.0.0.0/24", []string{"10.0.0.10-10.0.0.20"}, nil)
	b, _ := FromList([]string{"10.0.0.21/24", "10.0.0.30/24"})
	if _, ok := a.Overlaps(b); ok {
		t.Fatal("disjoint pools overlap")
	}
	c, _ := FromList([]string{"10.0.0.15/24"})
	if x, ok := a.Overlaps(c); !ok || x != netip.MustParseAddr("10.0.0.15") {
		t.Fatalf("overlap = %v %v", x, ok)
	}
	v6, _ := FromList([]string{"fd00::1/64"})
	if _, ok := a.Overlaps(v6); ok {
		t.Fatal("IPv4 and IPv6 overlap")
	}
}

// FuzzNew: pool entries are user input; any string must give a pool or a
// FieldError, never a panic, and a pool's walk stays inside it.
func FuzzNew(f *testing.F) {
	f.Add("10.0.0.0/24", "10.0.0.10-10.0.0.20", "10.0.0.15")
	f.Add("fd00::/120", "fd00::10/124", "fd00::11-fd00::12")
	f.Add("10.0.0.0/31", "", "10.0.0.0/8")
	f.Fuzz(func(t *testing.T, cidr, rng, excl string) {
		var ranges, exclude []string
		if rng != "" {
			ranges = []string{rng}
		}
		if excl != "" {
			exclude = []string{excl}
		}
		p, err := New(cidr, ranges, exclude)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v is not a FieldError", err)
			}
			return
		}
		n := 0
		p.Walk(big.NewInt(7), func(a netip.Addr) bool {
			if !p.Contains(a) {
				t.Fatalf("walk left the pool at %s", a)
			}
			n++
			return n < 300
		})
	})
}

func BenchmarkWalkFirstFree(b *testing.B) {
	p, _ := New("10.0.0.0/16", nil, nil)
	used := map[netip.Addr]bool{}
	p.Walk(big.NewInt(0), func(a netip.Addr) bool { used[a] = true; return len(used) < 20000 })
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		p.Walk(big.NewInt(int64(i)*7919), func(a netip.Addr) bool { return used[a] })
	}
}
