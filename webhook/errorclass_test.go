package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/metrics"
	"github.com/kvnet/kvnet/webhook"
)

// failWith is a mutator, validator and pod mutator that returns err (or
// panics with it when panics is set).
type failWith struct {
	err    error
	panics bool
}

func (failWith) Name() string { return "fail" }
func (f failWith) fail() error {
	if f.panics {
		panic(f.err)
	}
	return f.err
}
func (f failWith) Mutate(context.Context, *chain.Request) error       { return f.fail() }
func (f failWith) MutatePod(context.Context, *chain.PodRequest) error { return f.fail() }
func (f failWith) Validate(context.Context, *chain.Request) (field.ErrorList, error) {
	return nil, f.fail()
}

// fieldErrs is a validator that finds the user's mistakes.
type fieldErrs struct{}

func (fieldErrs) Name() string { return "field-errors" }
func (fieldErrs) Validate(_ context.Context, r *chain.Request) (field.ErrorList, error) {
	return field.ErrorList{field.Invalid(r.NetworkPath(0).Child("name"), "x", "bad")}, nil
}

// TestErrorClasses covers every way a handler can end in an error: the
// user's mistakes (a chain.Refusal) keep their 4xx and field path; whatever
// kvnet failed to do itself is a 500 that names what kvnet was doing and is
// counted as outcome "error", whatever API status it wraps. (Before kvnet
// told refusals apart, a 403/404/429 from kvnet's own calls came back as a
// refusal of the user's object: the "kvnet's own ..." rows failed.)
func TestErrorClasses(t *testing.T) {
	gr := schema.GroupResource{Group: "k8s.cni.cncf.io", Resource: "ipamclaims"}
	own := func(err error) error { return fmt.Errorf("reading IPAMClaim tenant-a/vm-blue: %w", err) }
	cases := map[string]struct {
		err   error
		code  int32
		field string // the cause a 4xx must carry
		says  string // what a 500's message must name
	}{
		"user: invalid field": {err: chain.RefuseInvalid(schema.GroupKind{Kind: "Pod"}, "a",
			field.ErrorList{field.Invalid(field.NewPath("metadata", "annotations").Key("k"), "v", "bad")}),
			code: 422, field: "metadata.annotations[k]"},
		"user: invalid, wrapped by the chain": {err: fmt.Errorf("mutator x: %w", chain.RefuseInvalid(schema.GroupKind{Kind: "Pod"}, "a",
			field.ErrorList{field.Required(field.NewPath("spec"), "")})), code: 422, field: "spec"},
		"user: forbidden":                 {err: chain.RefuseForbidden("pool exhausted"), code: http.StatusForbidden},
		"kvnet's own 403 (RBAC)":          {err: own(apierrors.NewForbidden(gr, "vm-blue", errors.New("no RBAC"))), code: 500, says: "reading IPAMClaim"},
		"kvnet's own 404":                 {err: own(apierrors.NewNotFound(gr, "vm-blue")), code: 500, says: "reading IPAMClaim"},
		"kvnet's own 429":                 {err: own(apierrors.NewTooManyRequests("slow down", 1)), code: 500, says: "reading IPAMClaim"},
		"kvnet's own 409":                 {err: own(apierrors.NewConflict(gr, "vm-blue", errors.New("changed"))), code: 500, says: "reading IPAMClaim"},
		"kvnet's own 422 on its write":    {err: own(apierrors.NewInvalid(schema.GroupKind{Kind: "IPAMClaim"}, "x", nil)), code: 500, says: "reading IPAMClaim"},
		"kvnet's own status, unwrapped":   {err: apierrors.NewForbidden(gr, "x", errors.New("no RBAC")), code: 500, says: "ipamclaims"},
		"kvnet's own 500":                 {err: own(apierrors.NewInternalError(errors.New("etcd"))), code: 500, says: "reading IPAMClaim"},
		"kvnet's own plain error":         {err: own(errors.New("connection refused")), code: 500, says: "connection refused"},
		"kvnet's own panic":               {err: errors.New("nil map"), code: 500, says: "unexpectedly"},
		"user: refusal inside a 500 path": {err: own(chain.RefuseForbidden("not for users")), code: http.StatusForbidden},
	}
	cfg := config.Static(exampleConfig(t))
	facts := exampleFacts(t)
	vm := toJSON(t, `{apiVersion: kubevirt.io/v1, kind: VirtualMachine, metadata: {name: a, namespace: dpu}, spec: {template: {spec: {domain: {devices: {}}}}}}`)
	pod := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"virt-launcher-a"},"spec":{"containers":[{"name":"compute","image":"x"}]}}`)
	type target struct {
		webhook string
		h       func(failWith) admission.Handler
		req     admission.Request
	}
	targets := map[string]target{
		"mutate VM": {webhook.MetricMutateVM, func(f failWith) admission.Handler {
			return &webhook.VMMutateHandler{Kind: chain.KindVM, Config: cfg, Facts: facts, Mutators: []chain.VMMutator{f}}
		}, review(chain.KindVM, admissionv1.Create, "", vm, nil)},
		"validate VM": {webhook.MetricValidateVM, func(f failWith) admission.Handler {
			return &webhook.VMValidateHandler{Kind: chain.KindVM, Config: cfg, Facts: facts, Validators: []chain.VMValidator{f}}
		}, review(chain.KindVM, admissionv1.Create, "", vm, nil)},
		"mutate pod": {"errclass-pods", func(f failWith) admission.Handler {
			return &webhook.PodMutateHandler{Name: "errclass-pods", Config: cfg, Facts: facts, Mutators: []chain.PodMutator{f}}
		}, podReview(admissionv1.Create, "tenant-a", pod, nil)},
	}
	for tname, tg := range targets {
		for cname, c := range cases {
			t.Run(tname+"/"+cname, func(t *testing.T) {
				errors0 := testutil.ToFloat64(metrics.Requests.WithLabelValues(tg.webhook, "error"))
				f := failWith{err: c.err, panics: strings.Contains(cname, "panic")}
				resp := tg.h(f).Handle(context.Background(), tg.req)
				if resp.Allowed || code(resp) != c.code {
					t.Fatalf("allowed=%v code=%d (%s), want %d", resp.Allowed, code(resp), resp.Result.Message, c.code)
				}
				counted := testutil.ToFloat64(metrics.Requests.WithLabelValues(tg.webhook, "error")) - errors0
				if c.code >= 500 {
					if !strings.Contains(resp.Result.Message, c.says) || !strings.Contains(resp.Result.Message, "kvnet") {
						t.Errorf("500 message %q does not say kvnet failed at %q", resp.Result.Message, c.says)
					}
					if counted != 1 {
						t.Errorf("kvnet's failure counted %v times as an error, want 1", counted)
					}
					return
				}
				if counted != 0 {
					t.Errorf("a user's mistake counted as kvnet's error")
				}
				if c.field != "" && (resp.Result.Details == nil || len(resp.Result.Details.Causes) == 0 || resp.Result.Details.Causes[0].Field != c.field) {
					t.Errorf("4xx without the field path %s: %+v", c.field, resp.Result.Details)
				}
			})
		}
	}
	// The validators' field errors become one 422 whose causes carry paths.
	h := &webhook.VMValidateHandler{Kind: chain.KindVM, Config: cfg, Facts: facts, Validators: []chain.VMValidator{fieldErrs{}}}
	resp := h.Handle(context.Background(), review(chain.KindVM, admissionv1.Create, "", vm, nil))
	if resp.Allowed || code(resp) != 422 || resp.Result.Details.Causes[0].Field != "spec.template.spec.networks[0].name" {
		t.Errorf("field errors: allowed=%v code=%d %+v", resp.Allowed, code(resp), resp.Result)
	}
}
