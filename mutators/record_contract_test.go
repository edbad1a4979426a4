package mutators_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kubevirtv1 "kubevirt.io/api/core/v1"

	"github.com/kvnet/kvnet/chain"
	"github.com/kvnet/kvnet/config"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/offline"
)

// The webhook computes a patch only when the chain recorded a change, and
// only over the request's Regions, so a mutator that changes the object
// without Record, or outside the regions, would have its change silently
// dropped. Over every example VM: the object changed exactly when changes
// were recorded, only inside the regions, and a second run changes nothing.
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
			req := chain.ForVM(&vm)
			req.Config, req.Facts = cfg, facts
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
			if err := onlyRegionsChanged(before, after, req.Regions()); err != nil {
				t.Errorf("%s run %d: %v", d.Source, run, err)
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

// onlyRegionsChanged reports a difference between before and after that lies
// outside every region: before with each region's value taken from after
// must equal after.
func onlyRegionsChanged(before, after []byte, regions []chain.Region) error {
	var b, a map[string]any
	if err := json.Unmarshal(before, &b); err != nil {
		return err
	}
	if err := json.Unmarshal(after, &a); err != nil {
		return err
	}
	for _, r := range regions {
		segs := strings.Split(strings.TrimPrefix(r.Pointer, "/"), "/")
		v, ok := lookupPath(a, segs)
		setPath(b, segs, v, ok)
	}
	nb, _ := json.Marshal(b)
	na, _ := json.Marshal(a)
	if !bytes.Equal(nb, na) {
		return fmt.Errorf("a mutator changed the object outside chain.Request.Regions:\n regions applied: %s\n mutated:         %s", nb, na)
	}
	return nil
}

func lookupPath(m map[string]any, segs []string) (any, bool) {
	cur := any(m)
	for _, s := range segs {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = mm[s]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func setPath(m map[string]any, segs []string, v any, present bool) {
	for _, s := range segs[:len(segs)-1] {
		next, ok := m[s].(map[string]any)
		if !ok {
			if !present {
				return
			}
			next = map[string]any{}
			m[s] = next
		}
		m = next
	}
	if present {
		m[segs[len(segs)-1]] = v
	} else {
		delete(m, segs[len(segs)-1])
	}
}
