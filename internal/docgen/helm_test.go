package docgen_test

import (
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/docgen"
)

// Every value is a row with its default and its comment; a block mapping
// is listed key by key, a flow mapping or a list as its default; a key
// without a comment is an error naming it.
func TestHelmValues(t *testing.T) {
	page, err := docgen.HelmValues([]byte(`# The file's header.

# Replicas.
replicaCount: 2
# The image.
image:
  # Its tag | a pipe.
  tag: ""
  # Its <resources>.
  resources: {cpu: 50m}
  # Pull secrets.
  secrets: [a, b]
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| `replicaCount` | `2` | Replicas. |",
		"## image\n\nThe image.\n",
		"| `image.tag` | `\"\"` | Its tag \\| a pipe. |",
		"| `image.resources` | `{\"cpu\":\"50m\"}` | Its &lt;resources&gt;. |",
		"| `image.secrets` | `[\"a\",\"b\"]` | Pull secrets. |",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page has no %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "header") {
		t.Errorf("the file's header comment is taken for its first key's:\n%s", page)
	}
	_, err = docgen.HelmValues([]byte("# Image.\nimage:\n  # Tag.\n  tag: x\n  pullPolicy: Always\n"))
	if err == nil || !strings.Contains(err.Error(), "image.pullPolicy has no comment") {
		t.Errorf("a key without a comment: %v", err)
	}
}
