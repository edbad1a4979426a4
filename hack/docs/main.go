// Command docs writes kvnet's generated reference pages (`make docs`; see
// hack/docs/pages for which). test/docs fails when a page differs from
// what this writes.
package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/kvnet/kvnet/hack/docs/pages"
)

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	all, err := pages.All(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docs:", err)
		os.Exit(1)
	}
	for _, name := range slices.Sorted(maps.Keys(all)) {
		if err := os.WriteFile(filepath.Join(root, name), []byte(all[name]), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "docs:", err)
			os.Exit(1)
		}
		fmt.Println("wrote", filepath.Join(root, name))
	}
}
