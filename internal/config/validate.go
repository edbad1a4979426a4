package config

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
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
	if nad := c.PersistentIPs.PrimaryUDN.DefaultNetworkNAD; nad != "" {
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
	} else {
		for _, msg := range validation.IsDNS1123Label(n.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), n.Name, msg))
		}
	}
	if n.NAD == "" {
		errs = append(errs, field.Required(p.Child("nad"), `a NetworkAttachmentDefinition as "namespace/name" or "name"`))
	} else if _, _, err := SplitNAD(n.NAD, "x"); err != nil {
		errs = append(errs, field.Invalid(p.Child("nad"), n.NAD, err.Error()))
	}
	if n.Binding != "" {
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

// SplitNAD turns "ns/name" or "name" into a namespace and a name, using
// defaultNamespace for the short form, as KubeVirt's multus.networkName does.
func SplitNAD(ref, defaultNamespace string) (namespace, name string, err error) {
	ns, n, found := strings.Cut(ref, "/")
	if !found {
		ns, n = defaultNamespace, ref
	}
	if strings.Contains(n, "/") {
		return "", "", fmt.Errorf("want namespace/name or name, got %d slashes", strings.Count(ref, "/"))
	}
	// The library checks with regular expressions, which cost more than
	// the rest of an admission's NAD lookup; a valid reference (nearly
	// every one) passes the byte checks below, and only one they refuse
	// goes to the library, for its messages.
	if !isDNSLabel(ns) {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			return "", "", fmt.Errorf("namespace %q: %s", ns, strings.Join(msgs, "; "))
		}
	}
	if !isDNSSubdomain(n) {
		if msgs := validation.IsDNS1123Subdomain(n); len(msgs) > 0 {
			return "", "", fmt.Errorf("name %q: %s", n, strings.Join(msgs, "; "))
		}
	}
	return ns, n, nil
}

// validateNADRef checks a "namespace/name" NAD reference that names no
// namespace by default: the default-network NAD lives in OVN-Kubernetes'
// namespace, not the VM's.
func validateNADRef(nad string, p *field.Path) field.ErrorList {
	if !strings.Contains(nad, "/") {
		return field.ErrorList{field.Invalid(p, nad, `want "namespace/name", e.g. ovn-kubernetes/default`)}
	}
	if _, _, err := SplitNAD(nad, ""); err != nil {
		return field.ErrorList{field.Invalid(p, nad, err.Error())}
	}
	return nil
}

// isDNSLabel reports whether s is an RFC 1123 label: at most 63 of a-z,
// 0-9 and '-', starting and ending with a letter or digit.
func isDNSLabel(s string) bool {
	return len(s) <= validation.DNS1123LabelMaxLength && isLabel(s)
}

// isDNSSubdomain reports whether s is an RFC 1123 subdomain: at most 253
// characters, labels (of any length) joined by single dots.
func isDNSSubdomain(s string) bool {
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
