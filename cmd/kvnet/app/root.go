// Package app wires kvnet's subcommands. It is the only place that knows
// about flags; everything it calls is a package tests can drive directly.
package app

import (
	"context"
	"errors"
	"io"

	"github.com/spf13/cobra"
)

// errInvalid marks a run that worked but found invalid objects: exit code 1
// without an extra error line, like a linter.
var errInvalid = errors.New("invalid objects found")

// ExitCode maps an error from Run to a process exit code.
func ExitCode(err error) int {
	if errors.Is(err, errInvalid) {
		return 1
	}
	return 2
}

// Run executes kvnet with args (without the program name).
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	root := RootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root.ExecuteContext(ctx)
}

// RootCommand is kvnet with every subcommand and its flags: what Run
// executes, and what docs/cli.md is generated from (make docs).
func RootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvnet",
		Short:         "Network admission for KubeVirt: Multus networks, vDPA, kube-ovn, persistent and migration IPs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// Every subcommand kvnet has.
	root.AddCommand(
		webhookCommand(),      // serve.go: the admission webhooks and controllers
		proxyCommand(),        // proxy.go: the cross-cluster migration proxy
		mutateCommand(),       // offline.go: kvnet mutate -f
		validateCommand(),     // offline.go: kvnet validate -f
		migrationIPsCommand(), // migration.go: the migration address table
		versionCommand(),      // version.go
	)
	return root
}
