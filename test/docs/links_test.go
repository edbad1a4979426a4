// Package docs checks kvnet's Markdown (README.md, CONTRIBUTING.md and
// docs/): every relative link reaches a file of the repository, and every
// #anchor a heading (or an explicit id) of the page it names. The pages are
// parsed by goldmark, as CommonMark with GitHub's extensions, not matched
// with regular expressions: a link inside code is no link, one inside a
// table is.
package docs_test

import (
	"bytes"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/text"
)

// root is the repository, two folders up from this test's.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// pages are the Markdown files the check reads, relative to the root.
func pages(t *testing.T, r string) []string {
	t.Helper()
	out := []string{"README.md", "CONTRIBUTING.md"}
	err := filepath.WalkDir(filepath.Join(r, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(r, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 5 {
		t.Fatalf("found %d Markdown pages; is this the repository?", len(out))
	}
	return out
}

// page is one parsed Markdown file: its links and the anchors it offers.
type page struct {
	links   []link
	anchors map[string]bool
}

type link struct {
	dest string
	line int
}

var md = goldmark.New(goldmark.WithExtensions(extension.GFM))

// htmlID finds the explicit anchors of raw HTML (<a id="x">, name="x").
var htmlID = regexp.MustCompile(`\b(?:id|name)="([^"]+)"`)

func parse(src []byte) page {
	doc := md.Parser().Parse(text.NewReader(src))
	p := page{anchors: map[string]bool{}}
	seen := map[string]int{}
	lineOf := func(n ast.Node) int {
		for ; n != nil; n = n.Parent() {
			if n.Type() == ast.TypeBlock && n.Lines().Len() > 0 {
				return bytes.Count(src[:n.Lines().At(0).Start], []byte("\n")) + 1
			}
		}
		return 0
	}
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch n := n.(type) {
		case *ast.Heading:
			slug := githubSlug(string(plainText(n, src)))
			if k := seen[slug]; k > 0 {
				p.anchors[fmt.Sprintf("%s-%d", slug, k)] = true
			} else {
				p.anchors[slug] = true
			}
			seen[slug]++
		case *ast.Link:
			p.links = append(p.links, link{dest: string(n.Destination), line: lineOf(n)})
		case *ast.Image:
			p.links = append(p.links, link{dest: string(n.Destination), line: lineOf(n)})
		case *ast.HTMLBlock, *ast.RawHTML:
			var raw []byte
			if hb, ok := n.(*ast.HTMLBlock); ok {
				for i := 0; i < hb.Lines().Len(); i++ {
					seg := hb.Lines().At(i)
					raw = append(raw, seg.Value(src)...)
				}
			} else {
				segs := n.(*ast.RawHTML).Segments
				for i := 0; i < segs.Len(); i++ {
					seg := segs.At(i)
					raw = append(raw, seg.Value(src)...)
				}
			}
			for _, m := range htmlID.FindAllSubmatch(raw, -1) {
				p.anchors[string(m[1])] = true
			}
		}
		return ast.WalkContinue, nil
	})
	return p
}

// plainText is a heading's text as GitHub slugs it: its inline text, code
// spans included, markup left out.
func plainText(n ast.Node, src []byte) []byte {
	var b bytes.Buffer
	_ = ast.Walk(n, func(c ast.Node, entering bool) (ast.WalkStatus, error) {
		if !entering {
			return ast.WalkContinue, nil
		}
		switch c := c.(type) {
		case *ast.Text:
			b.Write(c.Segment.Value(src))
		case *ast.String:
			b.Write(c.Value)
		}
		return ast.WalkContinue, nil
	})
	return b.Bytes()
}

// githubSlug is the anchor GitHub gives a heading: lower case; letters,
// digits, spaces, hyphens and underscores kept, everything else dropped;
// each space a hyphen.
func githubSlug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(s)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Every relative link of README.md, CONTRIBUTING.md and docs/ reaches a
// file or folder of the repository, and every #anchor a heading or an
// explicit id of the page it names.
func TestLinksAndAnchorsResolve(t *testing.T) {
	r := root(t)
	parsed := map[string]page{}
	get := func(rel string) (page, error) {
		if p, ok := parsed[rel]; ok {
			return p, nil
		}
		src, err := os.ReadFile(filepath.Join(r, rel))
		if err != nil {
			return page{}, err
		}
		parsed[rel] = parse(src)
		return parsed[rel], nil
	}
	checked := 0
	var broken []string
	for _, rel := range pages(t, r) {
		p, err := get(rel)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range p.links {
			u, err := url.Parse(l.dest)
			if err != nil {
				broken = append(broken, fmt.Sprintf("%s:%d: %q does not parse: %v", rel, l.line, l.dest, err))
				continue
			}
			if u.Scheme != "" || u.Host != "" || strings.HasPrefix(l.dest, "//") {
				continue // another site's: not this test's
			}
			checked++
			target := rel
			if u.Path != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(rel), u.Path)))
				if strings.HasPrefix(target, "../") {
					broken = append(broken, fmt.Sprintf("%s:%d: %s leaves the repository", rel, l.line, l.dest))
					continue
				}
				if _, err := os.Stat(filepath.Join(r, target)); err != nil {
					broken = append(broken, fmt.Sprintf("%s:%d: %s: no %s", rel, l.line, l.dest, target))
					continue
				}
			}
			if u.Fragment == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				broken = append(broken, fmt.Sprintf("%s:%d: %s: an anchor into %s, which is not Markdown", rel, l.line, l.dest, target))
				continue
			}
			tp, err := get(target)
			if err != nil {
				t.Fatal(err)
			}
			if !tp.anchors[u.Fragment] {
				broken = append(broken, fmt.Sprintf("%s:%d: %s: %s has no heading #%s", rel, l.line, l.dest, target, u.Fragment))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d relative links; the parser found too few", checked)
	}
	slices.Sort(broken)
	for _, b := range broken {
		t.Error(b)
	}
	t.Logf("%d relative links checked in %d pages", checked, len(parsed))
}

// The slugs are GitHub's, on headings of the kinds these pages have.
func TestGitHubSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Leases in the source cluster":               "leases-in-the-source-cluster",
		"`kvnet webhook` flags":                      "kvnet-webhook-flags",
		"Beside ipam-extensions, and moving from it": "beside-ipam-extensions-and-moving-from-it",
		"Names shared with ipam-extensions":          "names-shared-with-ipam-extensions",
		"NRI: what stays open":                       "nri-what-stays-open",
		"KvnetLeaseHeldLong":                         "kvnetleaseheldlong",
		"1. Install (cert-manager)":                  "1-install-cert-manager",
	} {
		if got := githubSlug(in); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", in, got, want)
		}
	}
	p := parse([]byte("# A `b` c\n\n## Twice\n\n## Twice\n\n<a id=\"here\"></a>\n\n[x](#twice-1)\n"))
	for _, a := range []string{"a-b-c", "twice", "twice-1", "here"} {
		if !p.anchors[a] {
			t.Errorf("anchor %q not found in %v", a, p.anchors)
		}
	}
	if len(p.links) != 1 || p.links[0].dest != "#twice-1" {
		t.Errorf("links %+v, want the one to #twice-1", p.links)
	}
}
