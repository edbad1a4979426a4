package framework

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The copied KubeVirt CRDs must be byte for byte what virt-operator
// generates: a hand edit would make every "the real schema accepted it"
// claim of the suite a claim about our own edit.
func TestKubeVirtCRDsAreUnchanged(t *testing.T) {
	dir := KubeVirtCRDDir()
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(strings.TrimSpace(sc.Text()), "  ")
		if !ok {
			t.Fatalf("malformed SHA256SUMS line %q", sc.Text())
		}
		want[name] = sum
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 20 || len(want) != 20 {
		t.Fatalf("%d CRD files and %d checksums, want the 20 virt-operator generates", len(files), len(want))
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want[filepath.Base(file)] {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %s", filepath.Base(file), got, want[filepath.Base(file)])
		}
	}
}
