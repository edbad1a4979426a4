package webhook_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/webhook"
)

// The VMIM webhook answers in the classes every kvnet webhook keeps apart:
// a migration ID already live in the namespace is the user's 422 naming
// the field (one of another namespace is not counted, see
// validators.MigrationIDs), an
// undecodable object a 400, a cache that cannot answer kvnet's 500.
func TestMigrationValidatorAnswers(t *testing.T) {
	facts := exampleFacts(t)
	facts.Migrations = []kubevirtv1.VirtualMachineInstanceMigration{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "vm1-in"},
		Spec:       kubevirtv1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1", Receive: &kubevirtv1.VirtualMachineInstanceMigrationTarget{MigrationID: "mig-victim"}},
		Status:     kubevirtv1.VirtualMachineInstanceMigrationStatus{Phase: kubevirtv1.MigrationWaitingForSync},
	}}
	cfg := config.Static(exampleConfig(t))
	hs := webhook.NewHandlers(cfg, facts, app.Chains(app.Capabilities{}))
	copied := toJSON(t, `{metadata: {name: copy-in, namespace: victim, annotations: {kvnet.io/skip: "true"}}, spec: {vmiName: vm1, receive: {migrationID: mig-victim}}}`)
	for name, c := range map[string]struct {
		h    webhook.Handlers
		op   admissionv1.Operation
		obj  []byte
		code int32 // 0: allowed
	}{
		"a copied ID, kvnet.io/skip notwithstanding": {h: hs, op: admissionv1.Create, obj: copied, code: http.StatusUnprocessableEntity},
		"a fresh ID":                     {h: hs, op: admissionv1.Create, obj: toJSON(t, `{metadata: {name: new-in, namespace: tenant-a}, spec: {vmiName: vm1, receive: {migrationID: mig-new}}}`)},
		"another namespace's ID":         {h: hs, op: admissionv1.Create, obj: toJSON(t, `{metadata: {name: copy-in, namespace: tenant-a}, spec: {vmiName: vm1, receive: {migrationID: mig-victim}}}`)},
		"an excluded namespace":          {h: hs, op: admissionv1.Create, obj: toJSON(t, `{metadata: {name: copy-in, namespace: kvnet-system}, spec: {vmiName: vm1, receive: {migrationID: mig-victim}}}`)},
		"an UPDATE (virt-api's to stop)": {h: hs, op: admissionv1.Update, obj: copied},
		"undecodable":                    {h: hs, op: admissionv1.Create, obj: []byte(`{"spec": {"receive": {"migrationID": 7}}}`), code: http.StatusBadRequest},
		"the cache cannot answer": {h: webhook.NewHandlers(cfg, failingFacts{}, app.Chains(app.Capabilities{})), op: admissionv1.Create, obj: copied,
			code: http.StatusInternalServerError},
	} {
		t.Run(name, func(t *testing.T) {
			resp := c.h[webhook.PathValidateVMIM].Handle(context.Background(), review(chain.KindVMIM, c.op, "", c.obj, c.obj))
			if c.code == 0 {
				if !resp.Allowed {
					t.Fatalf("refused: %v", resp.Result)
				}
				return
			}
			if resp.Allowed || code(resp) != c.code {
				t.Fatalf("allowed=%v code=%d (%v), want %d", resp.Allowed, code(resp), resp.Result, c.code)
			}
			switch c.code {
			case http.StatusUnprocessableEntity:
				d := resp.Result.Details
				if d == nil || chain.Kind(d.Kind) != chain.KindVMIM || d.Name != "copy-in" || len(d.Causes) != 1 {
					t.Fatalf("details %+v, want one cause on VirtualMachineInstanceMigration copy-in", d)
				}
				if cs := d.Causes[0]; cs.Field != "spec.receive.migrationID" || cs.Type != metav1.CauseTypeFieldValueInvalid ||
					!strings.Contains(cs.Message, "already used by live migration vm1-in") {
					t.Errorf("cause %+v, want spec.receive.migrationID already used by live migration vm1-in", cs)
				}
			case http.StatusInternalServerError:
				if !strings.Contains(resp.Result.Message, "spec.receive.migrationID") || !strings.Contains(resp.Result.Message, "cache not synced") {
					t.Errorf("message %q does not say what was looked up", resp.Result.Message)
				}
			}
		})
	}
}
