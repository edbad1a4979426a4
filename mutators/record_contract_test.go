package mutators_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/offline"
)

// The webhook computes a patch only when the chain recorded a change, so a
// mutator that changes the object without Record would have its change
// silently dropped. Over every example VM: the object changed exactly when
// changes were recorded, and a second run changes nothing and records nothing.
func TestChangesAreAlwaysRecorded(t *testing.T) {
	dir := filepath.Join("..", "examples")
	docs, err := offline.ReadFiles([]string{dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	facts, err := offline.Facts(docs)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data, "")
	if err != nil {
		t.Fatal(err)
	}
	vms := 0
	for _, d := range docs {
		if d.Kind != chain.KindVM {
			continue
		}
		vms++
		var vm kubevirtv1.VirtualMachine
		if err := json.Unmarshal(d.Raw, &vm); err != nil {
			t.Fatal(err)
		}
		for run := 1; run <= 2; run++ {
			before, _ := json.Marshal(&vm)
			req := &chain.Request{
				Kind: chain.KindVM, Name: vm.Name, Namespace: vm.Namespace,
				Meta: &vm.ObjectMeta, TemplateMeta: &vm.Spec.Template.ObjectMeta, Spec: &vm.Spec.Template.Spec,
				SpecPath: field.NewPath("spec", "template", "spec"), TemplateMetaPath: field.NewPath("spec", "template", "metadata"),
				Config: cfg, Facts: facts,
			}
			if chain.SkipReason(req) != "" {
				break
			}
			if err := chain.RunMutators(context.Background(), req, mutators.Default()); err != nil {
				t.Fatalf("%s run %d: %v", d.Source, run, err)
			}
			after, _ := json.Marshal(&vm)
			changed := !bytes.Equal(before, after)
			if changed != (len(req.Changes) > 0) {
				t.Errorf("%s run %d: object changed=%v but recorded %v", d.Source, run, changed, req.Changes)
			}
			if run == 2 && changed {
				t.Errorf("%s: the second run changed the object again (not idempotent)", d.Source)
			}
		}
	}
	if vms < 4 {
		t.Fatalf("only %d example VMs found", vms)
	}
}
