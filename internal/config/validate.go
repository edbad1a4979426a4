package config

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/kvnet/kvnet/internal/model/dnsname"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

// Validate checks what the schema cannot: names, references and selectors.
// It runs before defaults, so an unset field is still visible as unset.
func Validate(c *Config) field.ErrorList {
	var errs field.ErrorList
	for i, ns := range c.ExcludedNamespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(field.NewPath("excludedNamespaces").Index(i), ns, msg))
		}
	}
	errs = append(errs, validateRules(c.NetworkRules, field.NewPath("networkRules"))...)
	errs = append(errs, validatePrefixes(c.SRIOV.ResourcePrefixes, field.NewPath("sriov", "resourcePrefixes"))...)
	errs = append(errs, validatePrefixes(c.VDPA.ResourcePrefixes, field.NewPath("vdpa", "resourcePrefixes"))...)
	if p := c.VDPA.BindingPlugin; p != "" {
		errs = append(errs, validateBindingName(p, field.NewPath("vdpa", "bindingPlugin"))...)
	}
	errs = append(errs, validateMigration(&c.Migration, field.NewPath("migration"))...)
	switch c.Resources.Inject {
	case "", InjectAuto, InjectNever:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("resources", "inject"), c.Resources.Inject, []string{InjectAuto, InjectNever}))
	}
	if nad := c.PersistentIPs.PrimaryUDN.DefaultNetworkNAD; !nad.IsZero() {
		errs = append(errs, validateNADRef(nad, field.NewPath("persistentIPs", "primaryUDN", "defaultNetworkNAD"))...)
	}
	return errs
}

func validateRules(rules []NetworkRule, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, r := range rules {
		rp := p.Index(i)
		switch {
		case r.Name == "":
			errs = append(errs, field.Required(rp.Child("name"), "every rule needs a name: it is recorded on the VMs it changes"))
		case seen[r.Name]:
			errs = append(errs, field.Duplicate(rp.Child("name"), r.Name))
		}
		seen[r.Name] = true
		errs = append(errs, validateSelector(r.NamespaceSelector, rp.Child("namespaceSelector"))...)
		errs = append(errs, validateSelector(r.VMSelector, rp.Child("vmSelector"))...)
		if len(r.Networks) == 0 {
			errs = append(errs, field.Required(rp.Child("networks"), "a rule must add at least one network"))
		}
		netNames := map[string]bool{}
		defaults := 0
		for j, n := range r.Networks {
			np := rp.Child("networks").Index(j)
			errs = append(errs, ValidateNetwork(n, np)...)
			if len(n.IPs) > 0 || n.MAC != "" || n.LogicalSwitch != "" {
				errs = append(errs, field.Forbidden(np, "a rule adds the network to many VMs, which cannot share fixed ips, mac or logicalSwitch; ask for them in the VM's kvnet.io/networks annotation"))
			}
			if netNames[n.Name] {
				errs = append(errs, field.Duplicate(np.Child("name"), n.Name))
			}
			netNames[n.Name] = true
			if n.DefaultRoute {
				defaults++
				if defaults > 1 {
					errs = append(errs, field.Invalid(np.Child("defaultRoute"), true, "only one network of a rule may carry the default route"))
				}
			}
		}
	}
	return errs
}

// ValidateNetwork checks one requested network; the annotation parser uses it too.
func ValidateNetwork(n Network, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if n.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), "the VMI network and interface name"))
	} else if !dnsname.Label(n.Name) { // the library's regular expression only for its message
		for _, msg := range validation.IsDNS1123Label(n.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), n.Name, msg))
		}
	}
	if n.NAD.IsZero() {
		errs = append(errs, field.Required(p.Child("nad"), `a NetworkAttachmentDefinition as "namespace/name" or "name"`))
	} else if err := n.NAD.Err(); err != nil {
		errs = append(errs, field.Invalid(p.Child("nad"), n.NAD.String(), err.Error()))
	}
	if n.Binding != "" && !dnsname.Label(n.Binding) { // the path only for an error: this runs on every kvnet.io/networks
		errs = append(errs, validateBindingName(n.Binding, p.Child("binding"))...)
	}
	errs = append(errs, n.Request.Validate(p)...)
	if n.PersistentIPs && len(n.IPs) > 0 {
		// Both ask for a persistent address, by two means Multus cannot
		// combine (it refuses "ips" with "ipam-claim-reference"): say which.
		errs = append(errs, field.Invalid(p.Child("ips"), n.IPs, "fixed ips already keep the address; drop persistentIPs (an IPAMClaim) or the ips"))
	}
	return errs
}

func validateBindingName(b string, p *field.Path) field.ErrorList {
	if dnsname.Label(b) {
		return nil
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(b) {
		errs = append(errs, field.Invalid(p, b, "want auto, bridge, sriov or the name of a binding plugin in the KubeVirt CR: "+msg))
	}
	return errs
}

func validateSelector(s *metav1.LabelSelector, p *field.Path) field.ErrorList {
	if s == nil {
		return nil
	}
	if _, err := metav1.LabelSelectorAsSelector(s); err != nil {
		return field.ErrorList{field.Invalid(p, s, err.Error())}
	}
	return nil
}

func validatePrefixes(prefixes []string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, s := range prefixes {
		if strings.TrimSpace(s) == "" {
			errs = append(errs, field.Invalid(p.Index(i), s, "an empty prefix would match every resource"))
		}
	}
	return errs
}

// validateNADRef checks a "namespace/name" NAD reference that names no
// namespace by default: the default-network NAD lives in OVN-Kubernetes'
// namespace, not the VM's.
func validateNADRef(nad netattach.Ref, p *field.Path) field.ErrorList {
	if !strings.Contains(nad.String(), "/") {
		return field.ErrorList{field.Invalid(p, nad.String(), `want "namespace/name", e.g. ovn-kubernetes/default`)}
	}
	if err := nad.Err(); err != nil {
		return field.ErrorList{field.Invalid(p, nad.String(), err.Error())}
	}
	return nil
}
