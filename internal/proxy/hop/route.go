package hop

import (
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kvnet/kvnet/internal/model/migrationid"
)

// VMRef is a VM by namespace and name; its VMI has the same name.
type VMRef struct {
	Namespace, Name string
}

func (v VMRef) String() string { return v.Namespace + "/" + v.Name }

// Route is whose a migration is on the hop: its ID, the VM that sends it
// and the VM the sending side means to receive it.
type Route struct {
	MigrationID string
	Source      VMRef
	Target      VMRef
}

// SameVM is the route of a migration that keeps its namespace and name.
func SameVM(migrationID, namespace, name string) Route {
	vm := VMRef{Namespace: namespace, Name: name}
	return Route{MigrationID: migrationID, Source: vm, Target: vm}
}

// Validate says what is wrong with r, naming the field.
func (r Route) Validate() error {
	if err := checkMigrationID(r.MigrationID); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		vm   VMRef
	}{{"source", r.Source}, {"target", r.Target}} {
		if errs := validation.IsDNS1123Label(f.vm.Namespace); len(errs) > 0 {
			return fmt.Errorf("%s.namespace %q: %s", f.name, f.vm.Namespace, strings.Join(errs, "; "))
		}
		if errs := validation.IsDNS1123Subdomain(f.vm.Name); len(errs) > 0 {
			return fmt.Errorf("%s.name %q: %s", f.name, f.vm.Name, strings.Join(errs, "; "))
		}
	}
	return nil
}

// appendRoute encodes r: per string (migration ID, source namespace and
// name, target namespace and name) a one-byte length and the bytes.
func appendRoute(b []byte, r Route) []byte {
	for _, s := range []string{r.MigrationID, r.Source.Namespace, r.Source.Name, r.Target.Namespace, r.Target.Name} {
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	return b
}

// readRoute reads what appendRoute wrote and validates it. Every length is
// one byte, so it never reads more than 5 x 256 bytes.
func readRoute(r io.Reader) (Route, error) {
	var fields [5]string
	var one [1]byte
	for i, what := range []string{"migration ID", "source namespace", "source name", "target namespace", "target name"} {
		if _, err := io.ReadFull(r, one[:]); err != nil {
			return Route{}, fmt.Errorf("%s length: %w", what, err)
		}
		b := make([]byte, one[0])
		if _, err := io.ReadFull(r, b); err != nil {
			return Route{}, fmt.Errorf("%s: %w", what, err)
		}
		fields[i] = string(b)
	}
	rt := Route{MigrationID: fields[0], Source: VMRef{fields[1], fields[2]}, Target: VMRef{fields[3], fields[4]}}
	return rt, rt.Validate()
}

// ParseVMRef reads "<namespace>/<name>" (migrationid.ParseVM).
func ParseVMRef(s string) (VMRef, error) {
	ns, name, err := migrationid.ParseVM(s)
	return VMRef{Namespace: ns, Name: name}, err
}
