// Command kvnet is KubeVirt's network admission layer: the webhook server and
// its offline twin. See the README for the subcommands.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "kvnet:", err)
		os.Exit(app.ExitCode(err))
	}
}
