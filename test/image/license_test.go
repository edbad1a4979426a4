package image

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// apache2SHA256 is the digest of the Apache License 2.0's standard text (as
// apache.org, Debian's common-licenses and every k8s.io module ship it), the
// text license scanners recognise.
const apache2SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"

// kvnet is Apache-2.0 wherever a user or a tool looks: LICENSE holds the
// license's standard text and the chart names it for Artifact Hub. (The
// image's OCI licenses label is checked by imagetest.Config, in TestMakeImage
// and in hack/image's own test.)
func TestLicense(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != apache2SHA256 {
		t.Errorf("LICENSE is not the standard Apache License 2.0 text (sha256 %x); copy it unchanged, e.g. from /usr/share/common-licenses/Apache-2.0 or a k8s.io module's LICENSE", sum)
	}
	chart, err := os.ReadFile(filepath.Join(root, "charts", "kvnet", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(chart, &c); err != nil {
		t.Fatal(err)
	}
	if got := c.Annotations["artifacthub.io/license"]; got != "Apache-2.0" {
		t.Errorf("Chart.yaml annotation artifacthub.io/license = %q, want Apache-2.0", got)
	}
}
