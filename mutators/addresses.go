package mutators

import (
	"context"
	"strings"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/internal/model/addresses"
)

// kube-ovn's per-attachment address annotations, prefixed by the provider.
const (
	KubeOVNIPAddress     = ".kubernetes.io/ip_address"
	KubeOVNMACAddress    = ".kubernetes.io/mac_address"
	KubeOVNLogicalSwitch = ".kubernetes.io/logical_switch"
)

// Addresses carries the per-network address requests of kvnet.io/networks
// (ips, mac, cniArgs, logicalSwitch) to where the CNI reads them:
//   - kube-ovn attachments get kube-ovn's own ip_address, mac_address and
//     logical_switch template annotations (kube-ovn reads those, not the
//     Multus element);
//   - every other attachment gets an entry in the template's
//     kvnet.io/addresses annotation, which KubeVirt copies to the launcher
//     pod, where AddressesPod writes it into the network's selection element.
//
// What the owner wrote on the template by hand is kept: the spec wins, as
// everywhere in kvnet. The Addresses validator checks the result.
type Addresses struct{}

// Name implements chain.Mutator.
func (Addresses) Name() string { return "addresses" }

// Mutate implements chain.Mutator.
func (m Addresses) Mutate(ctx context.Context, req *chain.Request) error {
	v, ok := req.Meta.Annotations[chain.NetworksAnnotation]
	if !ok || !addresses.MayRequest(v) {
		return nil // the common case: no address asked for, nothing to parse
	}
	// Only the annotation, not config rules: rules cannot carry addresses
	// (config validation refuses them).
	nets, errs := ParseRequested(v, AnnotationPath)
	if len(errs) > 0 {
		return req.Invalid(errs)
	}
	wanted := make([]WantedNetwork, len(nets))
	for i, n := range nets {
		wanted[i] = WantedNetwork{Rule: chain.NetworksAnnotation, Network: n}
	}
	var table map[string]addresses.Request
	tableChanged := false
	for _, w := range wanted {
		r := w.Network.Request
		if w.Rule != chain.NetworksAnnotation || r.Empty() {
			continue
		}
		_, net := req.Network(w.Network.Name)
		if net == nil || net.Multus == nil {
			continue // the validator says why
		}
		info, err := req.NAD(ctx, net.Multus.NetworkName)
		if err != nil {
			return err
		}
		changed := false
		if info != nil && info.IsKubeOVN() {
			provider := info.KubeOVNProvider()
			if len(r.IPs) > 0 {
				ips := make([]string, len(r.IPs))
				for i, ip := range r.IPs {
					ips[i] = addresses.Addr(ip)
				}
				changed = setAnnotation(req, provider+KubeOVNIPAddress, strings.Join(ips, ",")) || changed
			}
			if r.MAC != "" {
				changed = setAnnotation(req, provider+KubeOVNMACAddress, strings.ToLower(r.MAC)) || changed
			}
			if r.LogicalSwitch != "" {
				changed = setAnnotation(req, provider+KubeOVNLogicalSwitch, r.LogicalSwitch) || changed
			}
			// cni-args still go through the selection element.
			r = addresses.Request{CNIArgs: r.CNIArgs}
		}
		if !r.Empty() {
			if table == nil {
				if table, err = templateTable(req); err != nil {
					return nil // malformed by hand: the validator reports it
				}
			}
			if cur, ok := table[net.Name]; !ok {
				table[net.Name] = r
				tableChanged, changed = true, true
			} else if !cur.Equal(r) {
				req.Warn("network %s: the template's %s entry is kept; kvnet.io/networks asks for other addresses", net.Name, addresses.Annotation)
			}
		}
		if changed {
			req.Record(m.Name(), w.Rule, net.Name)
		}
	}
	if tableChanged {
		if req.TemplateMeta.Annotations == nil {
			req.TemplateMeta.Annotations = map[string]string{}
		}
		req.TemplateMeta.Annotations[addresses.Annotation] = addresses.Format(table)
	}
	return nil
}

// templateTable reads the template's kvnet.io/addresses, empty when unset.
func templateTable(req *chain.Request) (map[string]addresses.Request, error) {
	v, ok := req.TemplateMeta.Annotations[addresses.Annotation]
	if !ok {
		return map[string]addresses.Request{}, nil
	}
	t, err := addresses.Parse(v)
	if t == nil && err == nil {
		t = map[string]addresses.Request{}
	}
	return t, err
}
