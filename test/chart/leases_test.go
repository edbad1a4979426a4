package chart

import (
	"reflect"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvnet/kvnet/internal/persistentips"
)

// The chart's <fullname>-lease-release ClusterRole grants exactly
// persistentips.LeaseReleaseRule (what setting kvnet.io/lease-release
// takes, which test/leases_test.go exercises on the API server) and is
// aggregated into the admin ClusterRole only: a namespace's admins may
// release its leases, its tenants (edit) may not.
func TestChartLeaseReleaseRoleIsForAdmins(t *testing.T) {
	var role *rbacv1.ClusterRole
	for _, o := range find(render(t, chartCase{release: "kvnet", namespace: "kvnet-system"}), "ClusterRole") {
		if strings.HasSuffix(o.GetName(), "-lease-release") {
			role = &rbacv1.ClusterRole{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, role); err != nil {
				t.Fatal(err)
			}
		}
	}
	if role == nil {
		t.Fatal("the chart renders no <fullname>-lease-release ClusterRole")
	}
	if role.Labels["rbac.authorization.k8s.io/aggregate-to-admin"] != "true" {
		t.Errorf("labels %v: want it aggregated into admin", role.Labels)
	}
	for _, l := range []string{"aggregate-to-edit", "aggregate-to-view"} {
		if _, ok := role.Labels["rbac.authorization.k8s.io/"+l]; ok {
			t.Errorf("labels %v: a tenant's role must not get it (%s)", role.Labels, l)
		}
	}
	if want := []rbacv1.PolicyRule{persistentips.LeaseReleaseRule}; !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("rules %+v, want %+v", role.Rules, want)
	}
}
