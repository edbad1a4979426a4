// Package requested reads what a VM asks kvnet for: the networks of the
// kvnet.io/networks annotation, in either of its forms, and the networks of
// the config rules that match it. Mutators add those networks; validators
// check them; both read them here, so the two never disagree on a meaning.
package requested

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/model/multus"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// Annotation asks for networks, in Multus short form ("ns/nad@name, nad2")
// or as a JSON list of networks (see Parse).
const Annotation = "kvnet.io/networks"

// AnnotationPath is the field path of Annotation, where its errors point.
var AnnotationPath = field.NewPath("metadata", "annotations").Key(Annotation)

// Wanted is one network a config rule or the annotation asks for.
type Wanted struct {
	// Rule names the config rule, or is Annotation.
	Rule string
	// Network is the rule's or the parsed annotation's own: read it, never
	// change it (a rule's is the live config's).
	Network *config.Network
}

// Parse reads the kvnet.io/networks annotation. It takes the Multus
// short form users already know ("ns/nad@name, nad2": the part after @ names
// the VMI network, the NAD name is used when it is absent) or a JSON list of
// {"name", "nad", "binding", "defaultRoute", "persistentIPs", "ips", "mac",
// "cniArgs", "logicalSwitch"} for the cases the short form cannot say. Errors carry the annotation's field path.
func Parse(value string, p *field.Path) ([]config.Network, field.ErrorList) {
	s := strings.TrimSpace(value)
	if s == "" {
		return nil, nil
	}
	var nets []config.Network
	if strings.HasPrefix(s, "[") {
		var ok bool
		if nets, ok = scanRequested(s); !ok {
			var msg string
			if nets, msg = requestedV1(s); msg != "" {
				return nil, field.ErrorList{field.Invalid(p, value, msg)}
			}
		}
	} else {
		for i, item := range strings.Split(s, ",") {
			ns, name, iface, err := multus.ParseShort(item)
			if err != nil {
				return nil, field.ErrorList{field.Invalid(p, value, fmt.Sprintf("item %d: %v", i, err))}
			}
			nad := name
			if ns != "" {
				nad = ns + "/" + name
			}
			if iface == "" {
				iface = name
			}
			nets = append(nets, config.Network{Name: iface, NAD: netattach.RefOf(nad)})
		}
	}
	var errs field.ErrorList
	var taken addresses.Taken
	defaultRoute := ""
	for i := range nets {
		n := &nets[i]
		if n.Binding == "" {
			n.Binding = config.BindingAuto
		}
		for _, e := range config.ValidateNetwork(*n, indexPath(i)) {
			errs = append(errs, field.Invalid(p, value, e.Error()))
		}
		for _, c := range taken.Take(n.Name, n.Request) {
			errs = append(errs, field.Invalid(p, value, fmt.Sprintf("networks %q and %q both ask for %s %s", c.Holder, n.Name, c.Kind, c.Addr)))
		}
		if slices.ContainsFunc(nets[:i], func(o config.Network) bool { return o.Name == n.Name }) {
			errs = append(errs, field.Invalid(p, value, fmt.Sprintf("network %q is requested twice", n.Name)))
		}
		if n.DefaultRoute {
			if defaultRoute != "" {
				errs = append(errs, field.Invalid(p, value, fmt.Sprintf("only one network may carry the default route; %q and %q both ask for it", defaultRoute, n.Name)))
			}
			defaultRoute = n.Name
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return nets, nil
}

// indexPaths are the paths of the first networks of a list, built once:
// ValidateNetwork takes the path of the network it checks, and names it
// only in an error.
var indexPaths = func() []*field.Path {
	out := make([]*field.Path, 16)
	for i := range out {
		out[i] = field.NewPath("[" + strconv.Itoa(i) + "]")
	}
	return out
}()

func indexPath(i int) *field.Path {
	if i < len(indexPaths) {
		return indexPaths[i]
	}
	return field.NewPath("[" + strconv.Itoa(i) + "]")
}

// requestedV1 decodes the JSON form as encoding/json does, or says why it
// cannot.
func requestedV1(s string) ([]config.Network, string) {
	var nets []config.Network
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&nets); err != nil {
		return nil, "not a JSON list of {name, nad, binding, defaultRoute, persistentIPs, ips, mac, cniArgs, logicalSwitch}: " + err.Error()
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, "unexpected data after the JSON list"
	}
	return nets, ""
}
