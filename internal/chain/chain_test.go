package chain_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/netattach"
)

func newRequest(annotations map[string]string) *chain.Request {
	cfg := config.Config{}.Default("kvnet")
	meta := &metav1.ObjectMeta{Name: "vm", Namespace: "ns", Annotations: annotations}
	spec := &kubevirtv1.VirtualMachineInstanceSpec{}
	return &chain.Request{
		Kind: chain.KindVM, Namespace: "ns", Name: "vm", Meta: meta, TemplateMeta: &metav1.ObjectMeta{},
		Spec: spec, SpecPath: field.NewPath("spec", "template", "spec"), Config: &cfg,
		Facts: &lookup.Snapshot{NADs: map[string]*netattach.Info{"ns/br": {Namespace: "ns", Name: "br"}}},
	}
}

type recorder struct {
	name string
	rule string
	nets []string
}

func (r recorder) Name() string { return r.name }
func (r recorder) Mutate(_ context.Context, req *chain.Request) error {
	if len(r.nets) > 0 {
		req.Record(r.name, r.rule, r.nets...)
	}
	return nil
}

func TestRecordMergesIntoAnnotation(t *testing.T) {
	prev := `[{"mutator":"networks","rule":"storage","networks":["storage"]}]`
	req := newRequest(map[string]string{chain.MutationsAnnotation: prev})
	err := chain.RunVMMutators(context.Background(), req, []chain.VMMutator{
		recorder{"networks", "storage", []string{"storage", "extra"}},
		recorder{"networks", "kvnet.io/networks", []string{"a"}},
		recorder{"networks", "kvnet.io/networks", []string{"b", "a"}},
		recorder{"vdpa", "", []string{"a"}},
		recorder{name: "idle"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []chain.Change
	if err := json.Unmarshal([]byte(req.Meta.Annotations[chain.MutationsAnnotation]), &got); err != nil {
		t.Fatal(err)
	}
	want := []chain.Change{
		{Mutator: "networks", Rule: "storage", Networks: []string{"storage", "extra"}},
		{Mutator: "networks", Rule: "kvnet.io/networks", Networks: []string{"a", "b"}},
		{Mutator: "vdpa", Networks: []string{"a"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("record = %+v\nwant %+v", got, want)
	}
}

// No change, no annotation; an unreadable old record is replaced.
func TestRecordEdges(t *testing.T) {
	req := newRequest(nil)
	if err := chain.RunVMMutators(context.Background(), req, []chain.VMMutator{recorder{name: "idle"}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := req.Meta.Annotations[chain.MutationsAnnotation]; ok {
		t.Error("annotation written without a change")
	}
	req = newRequest(map[string]string{chain.MutationsAnnotation: "not json"})
	if err := chain.RunVMMutators(context.Background(), req, []chain.VMMutator{recorder{"n", "", []string{"x"}}}); err != nil {
		t.Fatal(err)
	}
	if got := req.Meta.Annotations[chain.MutationsAnnotation]; got != `[{"mutator":"n","networks":["x"]}]` {
		t.Errorf("record = %s", got)
	}
}

func TestSkipReason(t *testing.T) {
	req := newRequest(nil)
	if r := chain.SkipReason(req); r != "" {
		t.Errorf("plain VM skipped: %s", r)
	}
	req = newRequest(map[string]string{chain.SkipAnnotation: "true"})
	if r := chain.SkipReason(req); r == "" {
		t.Error("kvnet.io/skip ignored")
	}
	req = newRequest(map[string]string{chain.SkipAnnotation: "false"})
	if r := chain.SkipReason(req); r != "" {
		t.Errorf("kvnet.io/skip: false skipped: %s", r)
	}
	req = newRequest(nil)
	req.Namespace = "kube-system"
	if r := chain.SkipReason(req); r == "" {
		t.Error("kube-system not skipped")
	}
	req.Namespace = "kvnet"
	if r := chain.SkipReason(req); r == "" {
		t.Error("own namespace not skipped")
	}
	req = newRequest(nil)
	now := metav1.Now()
	req.Meta.DeletionTimestamp = &now
	if r := chain.SkipReason(req); r == "" {
		t.Error("terminating VM not skipped")
	}
}

type failing struct{ err error }

func (f failing) Name() string                                 { return "failing" }
func (f failing) Mutate(context.Context, *chain.Request) error { return f.err }
func (f failing) Validate(context.Context, *chain.Request) (field.ErrorList, error) {
	return nil, f.err
}

type panicking struct{}

func (panicking) Name() string                                 { return "panicking" }
func (panicking) Mutate(context.Context, *chain.Request) error { panic("oops") }
func (panicking) Validate(context.Context, *chain.Request) (field.ErrorList, error) {
	panic("oops")
}

type reporting struct{ errs field.ErrorList }

func (reporting) Name() string { return "reporting" }
func (r reporting) Validate(context.Context, *chain.Request) (field.ErrorList, error) {
	return r.errs, nil
}

func TestRunnersContainFailures(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom")
	if err := chain.RunVMMutators(ctx, newRequest(nil), []chain.VMMutator{failing{boom}, panicking{}}); !errors.Is(err, boom) || !strings.Contains(err.Error(), "failing") {
		t.Errorf("mutator error = %v, want it wrapped with the mutator's name", err)
	}
	if err := chain.RunVMMutators(ctx, newRequest(nil), []chain.VMMutator{panicking{}}); err == nil || !strings.Contains(err.Error(), "panicking") {
		t.Errorf("mutator panic = %v, want an error naming it", err)
	}
	if _, err := chain.RunVMValidators(ctx, newRequest(nil), []chain.VMValidator{panicking{}}); err == nil || !strings.Contains(err.Error(), "panicking") {
		t.Errorf("validator panic = %v", err)
	}
	if _, err := chain.RunVMValidators(ctx, newRequest(nil), []chain.VMValidator{failing{boom}}); !errors.Is(err, boom) {
		t.Errorf("validator error = %v", err)
	}
	a := field.ErrorList{field.Required(field.NewPath("a"), "")}
	b := field.ErrorList{field.Invalid(field.NewPath("b"), 1, ""), field.NotFound(field.NewPath("c"), "x")}
	errs, err := chain.RunVMValidators(ctx, newRequest(nil), []chain.VMValidator{reporting{a}, reporting{}, reporting{b}})
	if err != nil || len(errs) != 3 || errs[0].Field != "a" || errs[2].Type != field.ErrorTypeNotFound {
		t.Errorf("joined errors = %v, %v", errs, err)
	}
}

func TestRequestHelpers(t *testing.T) {
	req := newRequest(nil)
	ctx := context.Background()
	if i, err := req.NAD(ctx, "br"); err != nil || i == nil || i.Ref() != "ns/br" {
		t.Errorf("NAD(br) = %v, %v", i, err)
	}
	if i, err := req.NAD(ctx, "ns/br"); err != nil || i == nil {
		t.Errorf("NAD(ns/br) = %v, %v", i, err)
	}
	if i, err := req.NAD(ctx, "other/br"); err != nil || i != nil {
		t.Errorf("NAD(other/br) = %v, %v", i, err)
	}
	if i, err := req.NAD(ctx, "a/b/c"); err != nil || i != nil {
		t.Errorf("malformed reference = %v, %v; want nil, nil (the validator reports it)", i, err)
	}
	req.Spec.Networks = []kubevirtv1.Network{{Name: "x"}}
	req.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{Name: "y"}, {Name: "x"}}
	if i, n := req.Network("x"); i != 0 || n != &req.Spec.Networks[0] {
		t.Errorf("Network(x) = %d", i)
	}
	if i, n := req.Interface("x"); i != 1 || n != &req.Spec.Domain.Devices.Interfaces[1] {
		t.Errorf("Interface(x) = %d", i)
	}
	if i, _ := req.Network("nope"); i != -1 {
		t.Errorf("Network(nope) = %d", i)
	}
	if p := req.InterfacePath(2).String(); p != "spec.template.spec.domain.devices.interfaces[2]" {
		t.Errorf("InterfacePath = %s", p)
	}
	if p := req.NetworkPath(1).String(); p != "spec.template.spec.networks[1]" {
		t.Errorf("NetworkPath = %s", p)
	}
	err := req.Invalid(field.ErrorList{field.NotFound(req.NetworkPath(0).Child("multus", "networkName"), "x")})
	if !strings.Contains(err.Error(), `VirtualMachine.kubevirt.io "vm" is invalid`) {
		t.Errorf("Invalid = %v", err)
	}
	req.Warn("a %d", 1)
	if !reflect.DeepEqual(req.Warnings, []string{"a 1"}) {
		t.Errorf("warnings = %v", req.Warnings)
	}
}
