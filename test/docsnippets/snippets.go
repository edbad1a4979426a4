// Package docsnippets finds the shell, YAML and JSON snippets of kvnet's
// guides (README.md and docs/, but for the generated references), each
// with the marker that says how a test runs it:
//
//	<!-- snippet: config -->            a kvnet config (or part of one): kvnet parses and validates it
//	<!-- snippet: vm: <id> -->          metadata of a VM: test/e2e applies a VM with it through kvnet on a
//	                                    real API server and checks what the guide says (by id)
//	<!-- snippet: make -->              make commands: each target runs dry (make -n), its recipe resolved
//	<!-- snippet: cli -->               kvnet command lines: each command and flag is kvnet's
//	<!-- snippet: json -->              a JSON value shown as is: it parses
//	<!-- snippet: not run: <reason> --> counted, with its reason
//
// The marker is the HTML comment right before the fence (in the same list
// item for an indented one). The pages are parsed by goldmark, as the link
// check parses them.
package docsnippets

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/text"
)

// Snippet is one fenced block of a guide.
type Snippet struct {
	Page string // relative to the repository root
	Line int    // of its first line
	Lang string
	// Kind is the marker's ("config", "vm", "make", "cli", "json", "not
	// run"); "" when the block has none. Arg is what follows it (the vm's
	// id, the reason it is not run).
	Kind, Arg string
	Text      string
}

func (s Snippet) String() string { return fmt.Sprintf("%s:%d (%s)", s.Page, s.Line, s.Lang) }

// Langs are the fence languages that are snippets.
var Langs = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true, "yaml": true, "json": true}

// generated are the reference pages make docs writes: their blocks are
// help text, not something to run.
var generated = map[string]bool{"docs/cli.md": true, "docs/metrics.md": true, "docs/helm-values.md": true}

var md = goldmark.New(goldmark.WithExtensions(extension.GFM))

// All returns every snippet of the guides under root, in page order.
func All(root string) ([]Snippet, error) {
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			if rel = filepath.ToSlash(rel); !generated[rel] {
				files = append(files, rel)
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []Snippet
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		doc := md.Parser().Parse(text.NewReader(src))
		err = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
			fence, ok := n.(*ast.FencedCodeBlock)
			if !entering || !ok {
				return ast.WalkContinue, nil
			}
			lang := string(fence.Language(src))
			if !Langs[lang] {
				return ast.WalkContinue, nil
			}
			s := Snippet{Page: f, Lang: lang}
			var body bytes.Buffer
			for i := range fence.Lines().Len() {
				seg := fence.Lines().At(i)
				if i == 0 {
					s.Line = bytes.Count(src[:seg.Start], []byte("\n")) + 1
				}
				body.Write(seg.Value(src))
			}
			s.Text = body.String()
			if prev, ok := fence.PreviousSibling().(*ast.HTMLBlock); ok {
				var c bytes.Buffer
				for i := range prev.Lines().Len() {
					seg := prev.Lines().At(i)
					c.Write(seg.Value(src))
				}
				s.Kind, s.Arg = marker(c.String())
			}
			out = append(out, s)
			return ast.WalkSkipChildren, nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// marker reads "<!-- snippet: kind[: arg] -->".
func marker(html string) (kind, arg string) {
	c := strings.TrimSpace(html)
	if !strings.HasPrefix(c, "<!--") || !strings.HasSuffix(c, "-->") {
		return "", ""
	}
	c = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(c, "<!--"), "-->"))
	rest, ok := strings.CutPrefix(c, "snippet:")
	if !ok {
		return "", ""
	}
	kind, arg, _ = strings.Cut(strings.TrimSpace(rest), ":")
	return strings.TrimSpace(kind), strings.Join(strings.Fields(arg), " ")
}
