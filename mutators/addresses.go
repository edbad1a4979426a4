package mutators

import (
	"context"
	"strings"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/model/addresses"
	"github.com/kvnet/kvnet/internal/model/kubeovn"
	"github.com/kvnet/kvnet/internal/model/requested"
)

// Addresses carries the per-network address requests of kvnet.io/networks
// (ips, mac, cniArgs, logicalSwitch) to where the CNI reads them:
//   - kube-ovn attachments get kube-ovn's own ip_address, mac_address and
//     logical_switch template annotations (kube-ovn reads those, not the
//     Multus element);
//   - on every other attachment, a mac becomes the interface's own
//     macAddress, where KubeVirt reads it for the guest and for the
//     selection element's "mac", and where a MAC pool such as kubemacpool
//     sees it (it records a MAC an interface asks for as taken, and fills
//     only interfaces that have none): written only to the launcher pod, the
//     MAC lost to the one KubeVirt wrote from the interface, and the pool
//     could hand it to another VM;
//   - their ips and cniArgs get an entry in the template's
//     kvnet.io/addresses annotation, which KubeVirt copies to the launcher
//     pod, where AddressesPod writes it into the network's selection element.
//
// What the owner wrote on the template by hand is kept: the spec wins, as
// everywhere in kvnet. The Addresses validator checks the result.
type Addresses struct{}

// Name implements chain.VMMutator.
func (Addresses) Name() string { return "addresses" }

// Mutate implements chain.VMMutator.
func (m Addresses) Mutate(ctx context.Context, req *chain.Request) error {
	v, ok := req.Meta.Annotations[requested.Annotation]
	if !ok || !addresses.MayRequest(v) {
		return nil // the common case: no address asked for, nothing to parse
	}
	// Only the annotation, not config rules: rules cannot carry addresses
	// (config validation refuses them).
	nets, errs := requested.Parse(v, requested.AnnotationPath)
	if len(errs) > 0 {
		return req.Invalid(errs)
	}
	var table map[string]addresses.Request
	tableChanged := false
	for _, n := range nets {
		r := n.Request
		if r.Empty() {
			continue
		}
		_, net := req.Network(n.Name)
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
				changed = setAnnotation(req, provider+kubeovn.IPAddress, strings.Join(ips, ",")) || changed
			}
			if r.MAC != "" {
				changed = setAnnotation(req, provider+kubeovn.MACAddress, strings.ToLower(r.MAC)) || changed
			}
			if r.LogicalSwitch != "" {
				changed = setAnnotation(req, provider+kubeovn.LogicalSwitch, r.LogicalSwitch) || changed
			}
			// cni-args still go through the selection element.
			r = addresses.Request{CNIArgs: r.CNIArgs}
		} else if r.MAC != "" {
			changed = interfaceMAC(req, net.Name, r.MAC) || changed
			r.MAC = ""
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
			req.Record(m.Name(), requested.Annotation, net.Name)
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

// interfaceMAC gives the interface of network the MAC kvnet.io/networks
// asks for, when it has none, and reports whether it changed. An
// interface that has another one keeps it, with a warning: the spec wins,
// and a MAC pool that ran before kvnet may have filled it.
func interfaceMAC(req *chain.Request, network, mac string) bool {
	_, iface := req.Interface(network)
	switch {
	case iface == nil:
		return false // the interfaces validator reports a network without one
	case iface.MacAddress == "":
		iface.MacAddress = strings.ToLower(mac)
		return true
	case !strings.EqualFold(iface.MacAddress, mac):
		req.Warn("network %s: interface %s keeps macAddress %s; kvnet.io/networks asks for %s", network, iface.Name, iface.MacAddress, mac)
	}
	return false
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
