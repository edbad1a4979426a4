// Command docs writes kvnet's generated reference pages (`make docs`):
// docs/cli.md from the commands and their flags, docs/metrics.md from the
// metrics kvnet registers, docs/helm-values.md from the chart's
// values.yaml. test/docs fails when a
// page differs from what this writes.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/docgen"
)

func main() {
	dir := "docs"
	if len(os.Args) > 1 {
		dir = os.Args[1]
	}
	var reg docgen.Recorder
	if err := app.RegisterMetrics(&reg); err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(1)
	}
	metrics, err := docgen.Metrics(&reg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(1)
	}
	values, err := os.ReadFile(filepath.Join(dir, "..", "charts", "kvnet", "values.yaml"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(1)
	}
	helm, err := docgen.HelmValues(values)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(1)
	}
	pages := map[string]string{"cli.md": docgen.CLI(app.RootCommand()), "metrics.md": metrics, "helm-values.md": helm}
	for name, text := range pages {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "docs:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", filepath.Join(dir, name))
	}
}
