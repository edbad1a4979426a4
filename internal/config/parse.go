package config

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Parse reads a policy file and validates it. Every error names the field
// (networkRules[0].networks[1].binding) and, when the file has it, the line,
// so that an admin can fix a ConfigMap without reading kvnet's source.
// The returned config has defaults applied.
func Parse(data []byte, ownNamespace string) (*Config, error) {
	var root yamlv3.Node
	if len(bytes.TrimSpace(data)) > 0 {
		if err := yamlv3.Unmarshal(data, &root); err != nil {
			return nil, fmt.Errorf("config is not valid YAML: %w", err)
		}
	}
	// Strict: a key given twice in one mapping is an error with its line,
	// not a silent "last one wins".
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("config is not valid YAML: %w", err)
	}
	var c Config
	if len(bytes.TrimSpace(js)) > 0 && string(js) != "null" {
		strict, err := sigsjson.UnmarshalStrict(js, &c, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err != nil {
			return nil, withLine(&root, err)
		}
		if len(strict) > 0 {
			errs := make([]error, 0, len(strict))
			for _, e := range strict {
				errs = append(errs, withLine(&root, e))
			}
			return nil, errors.Join(errs...)
		}
	}
	if errs := Validate(&c); len(errs) > 0 {
		out := make([]error, 0, len(errs))
		for _, e := range errs {
			out = append(out, lineError(&root, e.Field, e))
		}
		return nil, errors.Join(out...)
	}
	d := c.Default(ownNamespace)
	return &d, nil
}

var (
	quotedPath = regexp.MustCompile(`field "([^"]+)"`)
	typeError  = regexp.MustCompile(`cannot unmarshal (\w+) into Go struct field \w+\.(\S+) of type (\S+)`)
)

// withLine decorates a decoding error with the field it names and its line.
func withLine(root *yamlv3.Node, err error) error {
	msg := err.Error()
	if m := typeError.FindStringSubmatch(msg); m != nil {
		// The decoder names the field without list indices
		// (networkRules.networks.defaultRoute): find the node it means.
		if path, n := findTyped(root, splitPath(m[2]), m[1]); n != nil {
			return fmt.Errorf("config line %d: %s: a %s is not allowed here, want %s", n.Line, path, m[1], m[3])
		}
		return lineError(root, m[2], fmt.Errorf("%s: a %s is not allowed here, want %s", m[2], m[1], m[3]))
	}
	if m := quotedPath.FindStringSubmatch(msg); m != nil {
		return lineError(root, m[1], err)
	}
	return fmt.Errorf("config: %w", err)
}

// lineError prefixes err with "line N: " when path resolves in the YAML tree.
func lineError(root *yamlv3.Node, path string, err error) error {
	if n := lookupNode(root, path); n != nil {
		return fmt.Errorf("config line %d: %w", n.Line, err)
	}
	return fmt.Errorf("config: %w", err)
}

// lookupNode walks a field path such as networkRules[0].networks[1].nad
// (or the dotted form networkRules.networks) through a YAML document and
// returns the deepest node it reaches, so that a missing key still points at
// its parent.
func lookupNode(root *yamlv3.Node, path string) *yamlv3.Node {
	n := root
	if n == nil || n.Kind == 0 {
		return nil
	}
	if n.Kind == yamlv3.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, seg := range splitPath(path) {
		next := (*yamlv3.Node)(nil)
		if idx, err := strconv.Atoi(seg); err == nil && n.Kind == yamlv3.SequenceNode {
			if idx >= 0 && idx < len(n.Content) {
				next = n.Content[idx]
			}
		} else if n.Kind == yamlv3.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == seg {
					// Point at the key: it is where the reader looks.
					if i+1 < len(n.Content) && n.Content[i+1].Kind != yamlv3.ScalarNode {
						next = n.Content[i+1]
						next = &yamlv3.Node{Kind: next.Kind, Content: next.Content, Line: n.Content[i].Line}
					} else {
						next = n.Content[i]
					}
					break
				}
			}
		}
		if next == nil {
			return n
		}
		n = next
	}
	return n
}

func splitPath(path string) []string {
	path = strings.ReplaceAll(path, "[", ".")
	path = strings.ReplaceAll(path, "]", "")
	var out []string
	for _, s := range strings.Split(path, ".") {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// findTyped finds the node a type error names by its index-free path,
// descending into every list element, and returns its indexed path. Among
// several nodes on the path it prefers one whose YAML kind is the JSON kind
// the decoder rejected (jsonKind: string, number, bool, object, array).
func findTyped(root *yamlv3.Node, segs []string, jsonKind string) (string, *yamlv3.Node) {
	if root == nil || root.Kind == 0 || len(segs) == 0 {
		return "", nil
	}
	n := root
	if n.Kind == yamlv3.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	var firstPath string
	var first *yamlv3.Node
	var walk func(n *yamlv3.Node, segs []string, path string) (string, *yamlv3.Node)
	walk = func(n *yamlv3.Node, segs []string, path string) (string, *yamlv3.Node) {
		switch n.Kind {
		case yamlv3.SequenceNode:
			for i, e := range n.Content {
				if p, m := walk(e, segs, fmt.Sprintf("%s[%d]", path, i)); m != nil {
					return p, m
				}
			}
		case yamlv3.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value != segs[0] {
					continue
				}
				p := segs[0]
				if path != "" {
					p = path + "." + segs[0]
				}
				v := n.Content[i+1]
				if len(segs) > 1 {
					return walk(v, segs[1:], p)
				}
				if first == nil {
					firstPath, first = p, n.Content[i]
				}
				if kindIs(v, jsonKind) {
					return p, n.Content[i]
				}
				return "", nil
			}
		}
		return "", nil
	}
	if p, m := walk(n, segs, ""); m != nil {
		return p, m
	}
	return firstPath, first
}

func kindIs(n *yamlv3.Node, jsonKind string) bool {
	switch jsonKind {
	case "object":
		return n.Kind == yamlv3.MappingNode
	case "array":
		return n.Kind == yamlv3.SequenceNode
	case "string":
		return n.Kind == yamlv3.ScalarNode && n.Tag == "!!str"
	case "number":
		return n.Kind == yamlv3.ScalarNode && (n.Tag == "!!int" || n.Tag == "!!float")
	case "bool":
		return n.Kind == yamlv3.ScalarNode && n.Tag == "!!bool"
	}
	return false
}
