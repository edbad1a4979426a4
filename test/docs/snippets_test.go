package docs_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/test/docsnippets"
)

// maxNotRun bounds the snippets the guides show that no test runs (each
// says why): a new one raises it, knowingly.
const maxNotRun = 10

// Every shell, YAML and JSON snippet of the guides says how it is run
// (docsnippets), and is: a config is parsed and validated as kvnet reads
// its file, make commands resolve (make -n), kvnet command lines name
// kvnet's commands and flags, JSON parses, and a VM's metadata is applied
// through kvnet by test/e2e TestGuideSnippetsThroughKvnet. Those not run
// are counted, each with its reason.
func TestSnippetsRunOrSayWhy(t *testing.T) {
	r := root(t)
	all, err := docsnippets.All(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 10 {
		t.Fatalf("found %d snippets; is this the repository?", len(all))
	}
	count := map[string]int{}
	var notRun []string
	for _, s := range all {
		count[s.Kind]++
		switch s.Kind {
		case "":
			t.Errorf("%s has no marker: put <!-- snippet: config|vm: <id>|make|cli|json|not run: <reason> --> right before it (test/docsnippets)", s)
		case "config":
			if _, err := config.Parse([]byte(s.Text), "kvnet"); err != nil {
				t.Errorf("%s: kvnet refuses this config: %v", s, err)
			}
		case "make":
			for _, line := range commandLines(s.Text) {
				checkMakeLine(t, r, s, line)
			}
		case "cli":
			for _, line := range commandLines(s.Text) {
				checkKvnetLine(t, s, line)
			}
		case "json":
			if !json.Valid([]byte(s.Text)) {
				t.Errorf("%s: not valid JSON", s)
			}
		case "vm":
			if s.Arg == "" {
				t.Errorf("%s: a vm snippet needs an id (<!-- snippet: vm: <id> -->) for test/e2e to check it by", s)
			}
		case "not run":
			if len(s.Arg) < 20 {
				t.Errorf("%s: not run, but the reason %q says too little", s, s.Arg)
			}
			notRun = append(notRun, s.String()+": "+s.Arg)
		default:
			t.Errorf("%s: unknown snippet kind %q", s, s.Kind)
		}
	}
	t.Logf("%d snippets: %v", len(all), count)
	for _, n := range notRun {
		t.Logf("not run: %s", n)
	}
	if len(notRun) > maxNotRun {
		t.Errorf("%d snippets are not run, more than %d: run them, or raise maxNotRun knowingly", len(notRun), maxNotRun)
	}
}

// commandLines are a shell snippet's commands: comments dropped,
// continued lines joined.
func commandLines(text string) []string {
	var out []string
	cur := ""
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		if line = strings.TrimSpace(cur + line); line != "" {
			out = append(out, line)
		}
		cur = ""
	}
	return out
}

var goTestRun = regexp.MustCompile(`-run '?\^?([A-Za-z0-9_]+)`)

// checkMakeLine resolves a make command dry (make -n), or finds the test
// a go test command runs in the package it names.
func checkMakeLine(t *testing.T, root string, s docsnippets.Snippet, line string) {
	t.Helper()
	args := strings.Fields(line)
	switch {
	case args[0] == "make":
		cmd := exec.Command("make", append([]string{"-n"}, args[1:]...)...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s: %q does not resolve: %v\n%s", s, line, err, out)
		}
	case args[0] == "go" && len(args) > 1 && args[1] == "test":
		pkg := args[len(args)-1]
		m := goTestRun.FindStringSubmatch(line)
		if m == nil || !strings.HasPrefix(pkg, "./") {
			t.Errorf("%s: %q: want go test -run <Test> ./<package>/", s, line)
			return
		}
		files, _ := filepath.Glob(filepath.Join(root, strings.TrimSuffix(pkg, "..."), "*_test.go"))
		found := false
		for _, f := range files {
			b, _ := os.ReadFile(f)
			found = found || strings.Contains(string(b), "func "+m[1]+"(")
		}
		if !found {
			t.Errorf("%s: %q: no %s in %s", s, line, m[1], pkg)
		}
	default:
		t.Errorf("%s: %q is not a make or go test command", s, line)
	}
}

// checkKvnetLine finds a kvnet command line's command and each of its
// flags in kvnet's command tree.
func checkKvnetLine(t *testing.T, s docsnippets.Snippet, line string) {
	t.Helper()
	args := strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(line))
	if args[0] != "kvnet" {
		t.Errorf("%s: %q is not a kvnet command", s, line)
		return
	}
	cmd, rest, err := app.RootCommand().Find(args[1:])
	if err != nil || cmd.Name() == "kvnet" {
		t.Errorf("%s: %q names no kvnet command: %v", s, line, err)
		return
	}
	for _, a := range rest {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
		if !hasFlag(cmd, name) {
			t.Errorf("%s: kvnet %s has no flag %s", s, cmd.Name(), a)
		}
	}
}

func hasFlag(cmd *cobra.Command, name string) bool {
	if f := cmd.Flags().Lookup(name); f != nil {
		return true
	}
	if len(name) == 1 && cmd.Flags().ShorthandLookup(name) != nil {
		return true
	}
	return slices.ContainsFunc([]*cobra.Command{cmd.Root()}, func(c *cobra.Command) bool { return c.PersistentFlags().Lookup(name) != nil })
}
