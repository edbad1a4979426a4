// Package addresses is a VM owner's request for fixed addresses on a
// secondary network: IPs, a MAC and CNI args. It is carried from the VM to
// the virt-launcher pod in one annotation, kvnet.io/addresses, on the VM
// template: KubeVirt copies template annotations to the VMI and from there
// to the pod, where kvnet writes each request into that network's Multus
// selection element. Multus has no per-network annotation of its own for
// this, and the VM cannot write the pod's networks annotation itself.
package addresses

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Annotation holds the requests on the VM template, VMI and launcher pod:
// a JSON object from VMI network name to Request.
const Annotation = "kvnet.io/addresses"

// Request is one network's address request.
type Request struct {
	// IPs in CIDR notation ("10.0.0.5/24", "fd00::5/64"), as Multus' "ips".
	IPs []string `json:"ips,omitempty"`
	// MAC of the pod interface, as Multus' "mac".
	MAC string `json:"mac,omitempty"`
	// CNIArgs is a JSON object passed as Multus' "cni-args".
	CNIArgs json.RawMessage `json:"cniArgs,omitempty"`
	// LogicalSwitch is kube-ovn's subnet for the attachment (kube-ovn only).
	LogicalSwitch string `json:"logicalSwitch,omitempty"`
}

// Empty reports whether the request asks for nothing.
func (r Request) Empty() bool {
	return len(r.IPs) == 0 && r.MAC == "" && len(r.CNIArgs) == 0 && r.LogicalSwitch == ""
}

// Equal compares two requests field by field (CNIArgs as compact JSON).
func (r Request) Equal(o Request) bool {
	a, _ := json.Marshal(r)
	b, _ := json.Marshal(o)
	return bytes.Equal(a, b)
}

// Prefixes returns the parsed IPs; those that do not parse are left out
// (Validate reports them).
func (r Request) Prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, s := range r.IPs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// Validate checks the request's syntax; p is the request's path.
func (r Request) Validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	fams := map[bool]bool{}
	for i, s := range r.IPs {
		pp := p.Child("ips").Index(i)
		pref, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, field.Invalid(pp, s, `want an IP in CIDR notation, e.g. "10.0.0.5/24": `+err.Error()))
			continue
		}
		if pref.Addr() == pref.Masked().Addr() && pref.Bits() < pref.Addr().BitLen()-1 {
			errs = append(errs, field.Invalid(pp, s, "is the network address of its subnet, not a host address"))
		}
		if fams[pref.Addr().Is4()] {
			errs = append(errs, field.Invalid(pp, s, "one IP per address family: Multus gives an interface one IPv4 and one IPv6 address at most"))
		}
		fams[pref.Addr().Is4()] = true
	}
	if r.MAC != "" {
		if hw, err := net.ParseMAC(r.MAC); err != nil || len(hw) != 6 {
			errs = append(errs, field.Invalid(p.Child("mac"), r.MAC, `want a 48-bit MAC such as "02:00:00:00:00:01"`))
		} else if hw[0]&1 == 1 {
			errs = append(errs, field.Invalid(p.Child("mac"), r.MAC, "is a multicast MAC; an interface needs a unicast one"))
		}
	}
	if len(r.CNIArgs) > 0 {
		var obj map[string]any
		if err := json.Unmarshal(r.CNIArgs, &obj); err != nil || obj == nil {
			errs = append(errs, field.Invalid(p.Child("cniArgs"), string(r.CNIArgs), "want a JSON object"))
		}
	}
	return errs
}

// Parse reads the annotation. Unknown keys are refused: a misspelt "ip"
// must not silently give the VM a random address.
func Parse(s string) (map[string]Request, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	var m map[string]Request
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf(`want a JSON object {"<network>": {"ips": [...], "mac": "...", "cniArgs": {...}}}: %w`, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the JSON object")
	}
	return m, nil
}

// Format writes the annotation (keys sorted, so the same requests always
// give the same value and no spurious patch).
func Format(m map[string]Request) string {
	b, _ := json.Marshal(m) // a map of plain structs always marshals
	return string(b)
}

// keys are the JSON keys of Request as they appear in kvnet.io/networks.
var keys = []string{`"ips"`, `"mac"`, `"cniArgs"`, `"logicalSwitch"`}

// MayRequest reports whether a kvnet.io/networks value can hold an address
// request: it is the JSON form and names one of Request's keys. It lets the
// admission hot path skip a second parse of every annotation that asks for
// networks only; a false positive costs just that parse.
func MayRequest(networks string) bool {
	if !strings.HasPrefix(strings.TrimSpace(networks), "[") {
		return false
	}
	for _, k := range keys {
		if strings.Contains(networks, k) {
			return true
		}
	}
	return false
}

// Addr strips the prefix length: what kube-ovn's ip_address takes.
func Addr(cidr string) string {
	if p, err := netip.ParsePrefix(cidr); err == nil {
		return p.Addr().String()
	}
	return cidr
}

// Taken tracks which network asked for each IP and MAC of one VM, so that
// two networks asking for one address are found, wherever the requests
// come from (kvnet.io/networks, kvnet.io/addresses, an interface's own
// macAddress).
type Taken struct {
	ips  map[netip.Addr]string
	macs map[string]string // lower-case
}

// Clash is an address a network asks for that another already holds.
type Clash struct {
	// Kind is "IP" or "MAC"; Addr is the address as the request wrote it.
	Kind, Addr string
	// Holder is the network that asked first.
	Holder string
}

// TakeMAC records mac as network's without checking it: a MAC the VM's
// spec already gives an interface.
func (t *Taken) TakeMAC(mac, network string) {
	if t.macs == nil {
		t.macs = map[string]string{}
	}
	t.macs[strings.ToLower(mac)] = network
}

// Take records r's addresses as network's and returns those another
// network asked for first. A network asking again for its own address is
// no clash.
func (t *Taken) Take(network string, r Request) []Clash {
	var out []Clash
	for _, ip := range r.Prefixes() {
		if t.ips == nil {
			t.ips = map[netip.Addr]string{}
		}
		if other, dup := t.ips[ip.Addr()]; dup && other != network {
			out = append(out, Clash{Kind: "IP", Addr: ip.Addr().String(), Holder: other})
		}
		t.ips[ip.Addr()] = network
	}
	if r.MAC != "" {
		mac := strings.ToLower(r.MAC)
		if other, dup := t.macs[mac]; dup && other != network {
			out = append(out, Clash{Kind: "MAC", Addr: r.MAC, Holder: other})
		}
		t.TakeMAC(r.MAC, network)
	}
	return out
}
