package migrationid

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// A migration ID names a migration; it does not say whose it is. The
// migration proxy ties each migration to the VM that sends it and the VM
// that receives it (proxy.Route). By default the VM keeps its namespace
// and name; these two annotations, each written in its own cluster by the
// users of its own namespace, let it move to another namespace or name:
// the source names the VM it sends to, the target approves the VM it
// receives from. Either alone would let a tenant of one cluster take
// another tenant's migration.
const (
	// AnnotationTarget, on a sending VMIM, names the VM in the peer
	// cluster that is to receive it: "<namespace>/<name>".
	AnnotationTarget = "kvnet.io/migration-target"
	// AnnotationSource, on a receiving VMIM, approves a sender of another
	// namespace or name: "<peer>/<namespace>/<name>", the peer proxy's
	// name as this cluster's proxy knows it and the sending VM.
	AnnotationSource = "kvnet.io/migration-source"
)

// ParseVM reads "<namespace>/<name>": a namespace (a DNS label) and a VM
// name (a DNS subdomain).
func ParseVM(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok {
		return "", "", fmt.Errorf("%q is not <namespace>/<name>", s)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", "", fmt.Errorf("namespace %q: %s", namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
	}
	return namespace, name, nil
}

// ParseApproval reads AnnotationSource's "<peer>/<namespace>/<name>".
func ParseApproval(s string) (peer, namespace, name string, err error) {
	peer, vm, ok := strings.Cut(s, "/")
	if !ok || peer == "" {
		return "", "", "", fmt.Errorf("%q is not <peer>/<namespace>/<name>", s)
	}
	if namespace, name, err = ParseVM(vm); err != nil {
		return "", "", "", err
	}
	return peer, namespace, name, nil
}
