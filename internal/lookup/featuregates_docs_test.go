package lookup

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// v190Gates reads the fixture of KubeVirt v1.9.0 gate names (its header says
// where they came from).
func v190Gates(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("testdata/kubevirt-v1.9.0-featuregates.txt")
	if err != nil {
		t.Fatal(err)
	}
	gates := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			gates[l] = true
		}
	}
	return gates
}

// gateMention is a `CamelCase` name; one with "gate", "alpha" or "beta"
// close by is taken for a feature gate.
var (
	gateMention = regexp.MustCompile("`([A-Z][A-Za-z0-9]+)`")
	gateWord    = regexp.MustCompile(`\bgates?\b|\balpha\b|\bbeta\b`)
)

// Every KubeVirt feature gate the README and docs name is one KubeVirt
// v1.9.0 has, unless the text says in the same breath that it is not in
// v1.9.0 (a proposal); so are the gates the examples enable and the one
// kvnet's code checks. A gate the docs invent sends users to a switch that
// does not exist.
func TestDocumentedFeatureGatesExistInKubeVirt190(t *testing.T) {
	gates := v190Gates(t)
	if !gates[MemLockFeatureGate] {
		t.Errorf("MemLockFeatureGate %q is not a v1.9.0 gate", MemLockFeatureGate)
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range append(docs, "../../README.md") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(b)), " ") // a mention may span lines
		for _, m := range gateMention.FindAllStringSubmatchIndex(text, -1) {
			name := text[m[2]:m[3]]
			if strings.HasPrefix(name, "Test") || strings.HasPrefix(name, "Benchmark") || strings.HasPrefix(name, "Fuzz") {
				continue // kvnet's own test names
			}
			near := strings.ToLower(text[max(0, m[0]-40):min(len(text), m[1]+40)])
			if !gateWord.MatchString(near) {
				continue
			}
			found++
			wide := text[max(0, m[0]-160):min(len(text), m[1]+160)]
			if !gates[name] && !strings.Contains(wide, "not in v1.9.0") {
				t.Errorf("%s names feature gate %q, which KubeVirt v1.9.0 does not have (testdata/kubevirt-v1.9.0-featuregates.txt): %q", filepath.Base(f), name, wide)
			}
		}
	}
	if found == 0 {
		t.Fatal("found no feature gate in the docs: the extraction is broken")
	}
	examples, err := filepath.Glob("../../examples/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range examples {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(b, []byte("\n---")) {
			var kv struct {
				Kind string `json:"kind"`
				Spec struct {
					Configuration struct {
						DeveloperConfiguration struct {
							FeatureGates []string `json:"featureGates"`
						} `json:"developerConfiguration"`
					} `json:"configuration"`
				} `json:"spec"`
			}
			if yaml.Unmarshal(doc, &kv) != nil || kv.Kind != "KubeVirt" {
				continue
			}
			for _, g := range kv.Spec.Configuration.DeveloperConfiguration.FeatureGates {
				if !gates[g] {
					t.Errorf("%s enables feature gate %q, which KubeVirt v1.9.0 does not have", filepath.Base(f), g)
				}
			}
		}
	}
}
