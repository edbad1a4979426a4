package offline_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/netattach"
	"github.com/kvnet/kvnet/internal/offline"
)

func TestReadFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "kind: VirtualMachine\nmetadata: {name: a}\n---\n# only a comment\n---\nkind: List\nitems:\n- {kind: VirtualMachineInstance, metadata: {name: b}}\n- {kind: Namespace, metadata: {name: c}}\n")
	write("b.json", `{"kind":"NetworkAttachmentDefinition","metadata":{"name":"n"},"spec":{"config":"{}"}}`)
	write("ignored.txt", "kind: VirtualMachine\n")
	docs, err := offline.ReadFiles([]string{dir, "-"}, strings.NewReader("kind: KubeVirt\nmetadata: {name: kv, namespace: kubevirt}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, d := range docs {
		kinds = append(kinds, d.Kind)
	}
	if got := strings.Join(kinds, ","); got != "VirtualMachine,VirtualMachineInstance,Namespace,NetworkAttachmentDefinition,KubeVirt" {
		t.Fatalf("kinds = %s", got)
	}
	if !strings.HasSuffix(docs[1].Source, "a.yaml#2.items[0]") {
		t.Errorf("source = %s", docs[1].Source)
	}
	facts, err := offline.Facts(docs)
	if err != nil {
		t.Fatal(err)
	}
	if i, _ := facts.NAD(context.Background(), netattach.Ref{Namespace: "default", Name: "n"}); i == nil {
		t.Error("a NAD without namespace is not in default")
	}
	if kv, _ := facts.KubeVirt(context.Background()); kv == nil || kv.Name != "kv" {
		t.Errorf("KubeVirt = %v", kv)
	}

	write("bad.yaml", "kind: [\n")
	if _, err := offline.ReadFiles([]string{filepath.Join(dir, "bad.yaml")}, nil); err == nil || !strings.Contains(err.Error(), "bad.yaml") {
		t.Errorf("bad YAML: %v", err)
	}
}

// Admit runs mutation then validation (the VM keeps its implicit pod network
// as networks[0]); other kinds are not admitted; a
// namespace-less VM lands in the admitter's namespace.
func TestAdmit(t *testing.T) {
	cfg := config.Config{}.Default("")
	facts, _ := offline.Facts(nil)
	a := app.NewOfflineAdmitter(&cfg, facts)
	a.Namespace = "team"
	ctx := context.Background()
	if _, ok, err := a.Admit(ctx, offline.Doc{Kind: "Namespace", Raw: []byte(`{}`)}); ok || err != nil {
		t.Errorf("Namespace admitted: %v %v", ok, err)
	}
	res, ok, err := a.Admit(ctx, offline.Doc{Source: "x", Kind: "VirtualMachine", Raw: []byte(
		`{"kind":"VirtualMachine","metadata":{"name":"v","annotations":{"kvnet.io/networks":"missing"}},"spec":{"template":{"spec":{}}}}`)})
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	if res.Mutated == nil || !strings.Contains(string(res.Mutated), `"missing"`) {
		t.Errorf("not mutated: %s", res.Mutated)
	}
	if !strings.Contains(res.Denied, "Not found") || !strings.Contains(res.Denied, "spec.template.spec.networks[1].multus.networkName") {
		t.Errorf("denied = %q, want the missing NAD", res.Denied)
	}
	res, _, _ = a.Admit(ctx, offline.Doc{Source: "y", Kind: "VirtualMachine", Raw: []byte(
		`{"kind":"VirtualMachine","metadata":{"name":"v","annotations":{"kvnet.io/networks":"a/b/c"}},"spec":{}}`)})
	if res.Mutated != nil || !strings.Contains(res.Denied, "kvnet.io/networks") {
		t.Errorf("bad annotation: mutated=%s denied=%q", res.Mutated, res.Denied)
	}
}
