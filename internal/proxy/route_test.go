package proxy

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// The sending VMIM names the receiving VM; nothing else can.
func TestRouteOf(t *testing.T) {
	vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db"}}
	send := func(ann string) *kubevirtv1.VirtualMachineInstanceMigration {
		m := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db-out"},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "db",
				SendTo: &kubevirtv1.VirtualMachineInstanceMigrationSource{MigrationID: "mig-1", ConnectURL: "b:9185"}}}
		if ann != "" {
			m.Annotations = map[string]string{AnnotationMigrationTarget: ann}
		}
		return m
	}
	if rt, err := RouteOf(vmi, send("")); err != nil || rt != hop.SameVM("mig-1", "team-a", "db") {
		t.Errorf("no annotation: got %+v, %v; want the same namespace and name", rt, err)
	}
	want := hop.Route{MigrationID: "mig-1", Source: hop.VMRef{Namespace: "team-a", Name: "db"}, Target: hop.VMRef{Namespace: "team-a-prod", Name: "db-1"}}
	if rt, err := RouteOf(vmi, send("team-a-prod/db-1")); err != nil || rt != want {
		t.Errorf("annotated: got %+v, %v; want %+v", rt, err, want)
	}
	for _, bad := range []string{"team-a-prod", "/db", "team-a-prod/", "Team/db", "a/b/c"} {
		if _, err := RouteOf(vmi, send(bad)); err == nil || !strings.Contains(err.Error(), AnnotationMigrationTarget) {
			t.Errorf("annotation %q: got %v, want an error naming the annotation", bad, err)
		}
	}
}

// A receiving VMIM takes its own VM from the same namespace and name, and
// another sender only by name, peer included.
func TestApproves(t *testing.T) {
	recv := func(ns, vmi, approval string) *kubevirtv1.VirtualMachineInstanceMigration {
		m := &kubevirtv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: vmi + "-in"},
			Spec: kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi,
				Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: "mig-1"}}}
		if approval != "" {
			m.Annotations = map[string]string{AnnotationMigrationSource: approval}
		}
		return m
	}
	same := hop.SameVM("mig-1", "team-a", "db")
	moved := hop.Route{MigrationID: "mig-1", Source: hop.VMRef{Namespace: "team-a", Name: "db"}, Target: hop.VMRef{Namespace: "team-a-prod", Name: "db-1"}}
	for name, c := range map[string]struct {
		m    *kubevirtv1.VirtualMachineInstanceMigration
		rt   hop.Route
		want string // "" accepted
	}{
		"same namespace and name":            {recv("team-a", "db", ""), same, ""},
		"another VMI of the namespace":       {recv("team-a", "web", ""), same, "receives VMI team-a/web, not team-a/db"},
		"another namespace":                  {recv("tenant", "db", ""), same, "receives VMI tenant/db, not team-a/db"},
		"moved, approved":                    {recv("team-a-prod", "db-1", "cluster-a/team-a/db"), moved, ""},
		"moved, not approved":                {recv("team-a-prod", "db-1", ""), moved, "does not approve VM team-a/db of peer cluster-a"},
		"moved, approved for another peer":   {recv("team-a-prod", "db-1", "cluster-c/team-a/db"), moved, "does not approve"},
		"moved, approved for another sender": {recv("team-a-prod", "db-1", "cluster-a/tenant/db"), moved, "does not approve"},
	} {
		err := approves(c.m, "cluster-a", c.rt)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want an error saying %q", name, err, c.want)
		}
	}
}
