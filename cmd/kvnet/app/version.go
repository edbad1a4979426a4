package app

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kvnet/kvnet/internal/version"
)

// versionCommand prints the build's version, commit and Go version: what a
// bug report needs and what the image test checks the binary against.
func versionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print kvnet's version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			switch output {
			case "":
				_, err := fmt.Fprintln(cmd.OutOrStdout(), info)
				return err
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				return enc.Encode(info)
			default:
				return fmt.Errorf("--output: %q is not one of: json", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", `"json" for machine-readable output`)
	return cmd
}
