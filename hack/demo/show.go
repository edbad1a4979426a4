package main

import (
	"fmt"
	"strings"

	ipamv1alpha1 "github.com/k8snetworkplumbingwg/ipamclaims/pkg/crd/ipamclaims/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/model/multus"
)

// The KubeVirt steps print objects in one line each, in the same spirit as
// the per-VM diff: what a reader needs to see that the outcome holds, not
// the whole object. These are pure, so demo_test.go checks them.

// formatElements renders a pod's k8s.v1.cni.cncf.io/networks, one selection
// element a line: the NAD, then every other key in the element's own order
// (interface, ips, ipam-claim-reference and whatever else it carries).
func formatElements(annotation string) ([]string, error) {
	elems, err := multus.Parse(annotation)
	if err != nil {
		return nil, err
	}
	lines := make([]string, 0, len(elems))
	for _, e := range elems {
		nad := e.Name()
		if ns := e.Namespace(); ns != "" {
			nad = ns + "/" + nad
		}
		parts := []string{nad}
		for _, k := range e.Keys() {
			if k == multus.KeyName || k == multus.KeyNamespace {
				continue
			}
			parts = append(parts, k+"="+compactJSON(e.Raw(k)))
		}
		lines = append(lines, strings.Join(parts, "  "))
	}
	return lines, nil
}

// compactJSON prints a JSON value as it would read in a YAML flow: strings
// without quotes, anything else as written.
func compactJSON(raw []byte) string {
	s := string(raw)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' && !strings.ContainsAny(s[1:len(s)-1], `"\`) {
		return s[1 : len(s)-1]
	}
	return s
}

// formatClaim renders an IPAMClaim: name, what the IPAM plugin keys it by,
// its controlling owner and UID (the UID is what shows a claim survived).
func formatClaim(c *ipamv1alpha1.IPAMClaim) string {
	owner := "no controller"
	if o := metav1.GetControllerOf(c); o != nil {
		owner = "owner " + o.Kind + "/" + o.Name
	}
	return fmt.Sprintf("IPAMClaim %s/%s  network=%s  interface=%s  %s  finalizers=%v  uid=%s",
		c.Namespace, c.Name, c.Spec.Network, c.Spec.Interface, owner, c.Finalizers, c.UID)
}

// formatAllocation renders one of kvnet's migration-address ConfigMaps.
func formatAllocation(a *migration.Allocation) string {
	s := fmt.Sprintf("ConfigMap %s/%s  pool=%s  address=%s  state=%s", a.CM.Namespace, a.CM.Name, a.Pool, a.CIDR(), a.State)
	if a.Node != "" {
		s += "  node=" + a.Node
	}
	if a.PodName != "" {
		s += "  pod=" + a.PodNamespace + "/" + a.PodName
	}
	return s
}
