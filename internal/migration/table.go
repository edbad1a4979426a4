package migration

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ReadTable returns every allocation of both pools, read from r (the API
// server, for the CLI), sorted by pool and address.
func ReadTable(ctx context.Context, r client.Reader, namespace string) ([]*Allocation, error) {
	all, err := listAllocations(ctx, r, namespace, "", nil)
	if err != nil {
		return nil, err
	}
	var out []*Allocation
	for _, pool := range []string{PoolInCluster, PoolCrossCluster} {
		for _, a := range all {
			if a.Pool == pool {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// WriteTable prints allocations for operators: one line per address, with
// who holds it and, for reservations, how long ago they were made.
func WriteTable(w io.Writer, allocs []*Allocation, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tADDRESS\tSTATE\tNODE\tPOD\tRESERVED")
	for _, a := range allocs {
		node, pod, age := dash(a.Node), "-", "-"
		switch a.State {
		case StateBound:
			pod = a.PodNamespace + "/" + a.PodName
		case StateReserved:
			pod = a.PodNamespace + "/(being created)"
		}
		if !a.ReservedAt.IsZero() {
			age = now.Sub(a.ReservedAt).Truncate(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.Pool, a.CIDR(), a.State, node, pod, age)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
