package proxy

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// table prints benchmark rows in aligned columns.
type table struct{ w *tabwriter.Writer }

func newTable(out io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) { fmt.Fprintln(t.w, strings.Join(cells, "\t")) }
func (t *table) flush()              { _ = t.w.Flush() }
