// Package ippool is the address arithmetic of kvnet's migration networks: a
// pool is a sorted set of disjoint address ranges (a CIDR narrowed by ranges
// and exclusions, or an explicit list), sized exactly even for IPv6, and
// walked from any offset without materialising it. It imports nothing of
// kvnet, so the config package can validate pools with the same code the
// allocator runs.
package ippool

import (
	"fmt"
	"math/big"
	"net/netip"
	"sort"
	"strings"
)

// Range is an inclusive span of addresses of one family.
type Range struct {
	First, Last netip.Addr
}

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// Pool is an immutable set of addresses. Each address has a prefix length,
// which the Multus "ips" element needs ("10.0.0.5/24").
type Pool struct {
	ranges []Range // sorted, disjoint, non-adjacent merged
	size   *big.Int
	// prefixBits is the prefix length of every address (CIDR pools).
	prefixBits int
	// bitsOf holds per-address prefix lengths (list pools); nil for CIDR pools.
	bitsOf map[netip.Addr]int
	desc   string
}

// FieldError says which entry of which list is wrong, so that the config
// validator can turn it into a field path.
type FieldError struct {
	// Field is "cidr", "ranges", "exclude" or "addresses".
	Field string
	// Index is the list index; -1 for "cidr".
	Index int
	Value string
	Msg   string
}

func (e *FieldError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("%s %q: %s", e.Field, e.Value, e.Msg)
	}
	return fmt.Sprintf("%s[%d] %q: %s", e.Field, e.Index, e.Value, e.Msg)
}

// New builds a pool from a CIDR, optional ranges inside it (default: the
// whole CIDR) and exclusions. Entries of ranges and exclude are an address,
// a CIDR or "first-last". When no ranges are given, the IPv4 network and
// broadcast addresses and the IPv6 subnet-router anycast address (the first
// one) are left out, as no host may use them.
func New(cidr string, ranges, exclude []string) (*Pool, error) {
	pfx, err := netip.ParsePrefix(strings.TrimSpace(cidr))
	if err != nil {
		return nil, &FieldError{Field: "cidr", Index: -1, Value: cidr, Msg: "not a CIDR (want e.g. 10.10.0.0/24 or fd00:10::/64)"}
	}
	if pfx.Masked() != pfx {
		return nil, &FieldError{Field: "cidr", Index: -1, Value: cidr, Msg: fmt.Sprintf("host bits are set; the network is %s", pfx.Masked())}
	}
	whole := prefixRange(pfx)
	var include []Range
	if len(ranges) == 0 {
		r := whole
		bits := pfx.Addr().BitLen()
		if pfx.Addr().Is4() && pfx.Bits() <= 30 {
			r.First, r.Last = r.First.Next(), r.Last.Prev()
		} else if pfx.Addr().Is6() && pfx.Bits() < bits-1 {
			r.First = r.First.Next()
		}
		include = []Range{r}
	} else {
		for i, s := range ranges {
			r, err := parseRange(s)
			if err != nil {
				return nil, &FieldError{Field: "ranges", Index: i, Value: s, Msg: err.Error()}
			}
			if !pfx.Contains(r.First) || !pfx.Contains(r.Last) {
				return nil, &FieldError{Field: "ranges", Index: i, Value: s, Msg: fmt.Sprintf("not inside the pool's cidr %s", pfx)}
			}
			include = append(include, r)
		}
	}
	var minus []Range
	for i, s := range exclude {
		r, err := parseRange(s)
		if err != nil {
			return nil, &FieldError{Field: "exclude", Index: i, Value: s, Msg: err.Error()}
		}
		if r.First.Is4() != pfx.Addr().Is4() {
			return nil, &FieldError{Field: "exclude", Index: i, Value: s, Msg: fmt.Sprintf("not the address family of the pool's cidr %s", pfx)}
		}
		minus = append(minus, r)
	}
	p := &Pool{ranges: subtract(normalize(include), normalize(minus)), prefixBits: pfx.Bits(), desc: pfx.String()}
	p.size = sizeOf(p.ranges)
	return p, nil
}

// FromList builds a pool from explicit "address/prefix" entries, such as
// the cross-cluster network's short list.
func FromList(addrs []string) (*Pool, error) {
	p := &Pool{bitsOf: map[netip.Addr]int{}}
	var rs []Range
	for i, s := range addrs {
		pfx, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, &FieldError{Field: "addresses", Index: i, Value: s, Msg: "want address/prefix-length, e.g. 192.168.50.10/24 (Multus static IPs need the prefix)"}
		}
		a := pfx.Addr()
		if _, dup := p.bitsOf[a]; dup {
			return nil, &FieldError{Field: "addresses", Index: i, Value: s, Msg: "listed twice"}
		}
		if len(rs) > 0 && rs[0].First.Is4() != a.Is4() {
			return nil, &FieldError{Field: "addresses", Index: i, Value: s, Msg: "mixes IPv4 and IPv6; one network, one family"}
		}
		if pfx.Bits() < a.BitLen() && (a == pfx.Masked().Addr() || (a.Is4() && pfx.Bits() <= 30 && a == prefixRange(pfx).Last)) {
			return nil, &FieldError{Field: "addresses", Index: i, Value: s, Msg: "is the network or broadcast address of its prefix"}
		}
		p.bitsOf[a] = pfx.Bits()
		rs = append(rs, Range{a, a})
	}
	p.ranges = normalize(rs)
	p.size = sizeOf(p.ranges)
	p.desc = fmt.Sprintf("%d listed addresses", len(addrs))
	return p, nil
}

// Size is the number of addresses in the pool.
func (p *Pool) Size() *big.Int { return new(big.Int).Set(p.size) }

// SizeFloat is Size for metrics (exact up to 2^53).
func (p *Pool) SizeFloat() float64 { f, _ := new(big.Float).SetInt(p.size).Float64(); return f }

// Ranges returns the pool's ranges in order.
func (p *Pool) Ranges() []Range { return append([]Range(nil), p.ranges...) }

// String describes the pool for messages: its CIDR or "N listed addresses".
func (p *Pool) String() string { return p.desc }

// Contains reports whether a is in the pool.
func (p *Pool) Contains(a netip.Addr) bool {
	i := sort.Search(len(p.ranges), func(i int) bool { return !p.ranges[i].Last.Less(a) })
	return i < len(p.ranges) && !a.Less(p.ranges[i].First)
}

// PrefixBits is the prefix length to give address a.
func (p *Pool) PrefixBits(a netip.Addr) int {
	if p.bitsOf != nil {
		return p.bitsOf[a]
	}
	return p.prefixBits
}

// CIDR is a with its prefix length, the form of a Multus "ips" entry.
func (p *Pool) CIDR(a netip.Addr) string {
	return netip.PrefixFrom(a, p.PrefixBits(a)).String()
}

// Overlaps reports whether the pools share an address, and one shared.
func (p *Pool) Overlaps(q *Pool) (netip.Addr, bool) {
	i, j := 0, 0
	for i < len(p.ranges) && j < len(q.ranges) {
		a, b := p.ranges[i], q.ranges[j]
		if a.First.Is4() != b.First.Is4() {
			return netip.Addr{}, false
		}
		lo, hi := maxAddr(a.First, b.First), minAddr(a.Last, b.Last)
		if !hi.Less(lo) {
			return lo, true
		}
		if a.Last.Less(b.Last) {
			i++
		} else {
			j++
		}
	}
	return netip.Addr{}, false
}

// Walk calls fn for every address, starting at the address with index
// start modulo the pool size and wrapping around, until fn returns false.
// It never builds the list, so a /64 costs no more than a /30.
func (p *Pool) Walk(start *big.Int, fn func(netip.Addr) bool) {
	if p.size.Sign() == 0 {
		return
	}
	off := new(big.Int).Mod(start, p.size)
	// Find the range holding the offset.
	ri := 0
	for ; ri < len(p.ranges); ri++ {
		n := rangeSize(p.ranges[ri])
		if off.Cmp(n) < 0 {
			break
		}
		off.Sub(off, n)
	}
	first := addOffset(p.ranges[ri].First, off)
	a := first
	for {
		if !fn(a) {
			return
		}
		if a == p.ranges[ri].Last {
			ri = (ri + 1) % len(p.ranges)
			a = p.ranges[ri].First
		} else {
			a = a.Next()
		}
		if a == first {
			return
		}
	}
}

func prefixRange(p netip.Prefix) Range {
	first := p.Masked().Addr()
	b := first.AsSlice()
	host := first.BitLen() - p.Bits()
	for i := len(b) - 1; i >= 0 && host > 0; i-- {
		n := min(host, 8)
		b[i] |= byte(1<<n - 1)
		host -= n
	}
	last, _ := netip.AddrFromSlice(b)
	return Range{first, last}
}

// parseRange reads "a", "a-b" or a CIDR.
func parseRange(s string) (Range, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Range{}, fmt.Errorf("not a CIDR")
		}
		return prefixRange(p), nil
	}
	lo, hi, isRange := strings.Cut(s, "-")
	a, err := netip.ParseAddr(strings.TrimSpace(lo))
	if err != nil || a.Zone() != "" {
		return Range{}, fmt.Errorf("want an address, a CIDR or first-last")
	}
	a = a.Unmap()
	if !isRange {
		return Range{a, a}, nil
	}
	b, err := netip.ParseAddr(strings.TrimSpace(hi))
	if err != nil || b.Zone() != "" {
		return Range{}, fmt.Errorf("the end of the range is not an address")
	}
	b = b.Unmap()
	if a.Is4() != b.Is4() {
		return Range{}, fmt.Errorf("mixes IPv4 and IPv6")
	}
	if b.Less(a) {
		return Range{}, fmt.Errorf("ends before it starts")
	}
	return Range{a, b}, nil
}

// normalize sorts and merges overlapping or adjacent ranges.
func normalize(rs []Range) []Range {
	if len(rs) == 0 {
		return nil
	}
	rs = append([]Range(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].First.Less(rs[j].First) })
	out := []Range{rs[0]}
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if last.Last.IsValid() && (!last.Last.Less(r.First) || last.Last.Next() == r.First) {
			if last.Last.Less(r.Last) {
				last.Last = r.Last
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// subtract removes every address of minus from in; both are normalized.
func subtract(in, minus []Range) []Range {
	var out []Range
	for _, r := range in {
		cur := []Range{r}
		for _, m := range minus {
			var next []Range
			for _, c := range cur {
				if c.First.Is4() != m.First.Is4() || m.Last.Less(c.First) || c.Last.Less(m.First) {
					next = append(next, c)
					continue
				}
				if c.First.Less(m.First) {
					next = append(next, Range{c.First, m.First.Prev()})
				}
				if m.Last.Less(c.Last) {
					next = append(next, Range{m.Last.Next(), c.Last})
				}
			}
			cur = next
		}
		out = append(out, cur...)
	}
	return out
}

func toInt(a netip.Addr) *big.Int { return new(big.Int).SetBytes(a.AsSlice()) }

func rangeSize(r Range) *big.Int {
	n := new(big.Int).Sub(toInt(r.Last), toInt(r.First))
	return n.Add(n, big.NewInt(1))
}

func sizeOf(rs []Range) *big.Int {
	n := new(big.Int)
	for _, r := range rs {
		n.Add(n, rangeSize(r))
	}
	return n
}

func addOffset(a netip.Addr, off *big.Int) netip.Addr {
	if off.Sign() == 0 {
		return a
	}
	n := new(big.Int).Add(toInt(a), off)
	b := make([]byte, a.BitLen()/8)
	n.FillBytes(b)
	out, _ := netip.AddrFromSlice(b)
	return out
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return b
	}
	return a
}

func minAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return a
	}
	return b
}
