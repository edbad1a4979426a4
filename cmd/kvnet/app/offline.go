package app

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/offline"
	"github.com/kvnet/kvnet/webhook"
)

type offlineFlags struct {
	files     []string
	nads      []string
	cfgPath   string
	kubevirt  []string
	namespace string
}

func (f *offlineFlags) register(c *cobra.Command) {
	c.Flags().StringArrayVarP(&f.files, "filename", "f", nil, "VMs and VMIs to admit: YAML/JSON files, directories, or - for stdin (repeatable)")
	c.Flags().StringArrayVar(&f.nads, "nads", nil, "NetworkAttachmentDefinitions (and Namespaces) the cluster would have (repeatable)")
	c.Flags().StringVar(&f.cfgPath, "config", "", "kvnet policy file (default: an empty policy)")
	c.Flags().StringArrayVar(&f.kubevirt, "kubevirt", nil, "the KubeVirt CR, for binding-plugin checks")
	c.Flags().StringVarP(&f.namespace, "namespace", "n", "default", "namespace for objects that name none")
	_ = c.MarkFlagRequired("filename")
}

// run admits every VM/VMI and calls emit for each result.
func (f *offlineFlags) run(c *cobra.Command, emit func(offline.Result) error) error {
	docs, err := offline.ReadFiles(f.files, c.InOrStdin())
	if err != nil {
		return err
	}
	state, err := offline.ReadFiles(append(append([]string(nil), f.nads...), f.kubevirt...), nil)
	if err != nil {
		return err
	}
	// Cluster objects given with -f count as cluster state too.
	facts, err := offline.Facts(append(state, docs...))
	if err != nil {
		return err
	}
	cfg := &config.Config{}
	if f.cfgPath != "" {
		data, err := os.ReadFile(f.cfgPath)
		if err != nil {
			return err
		}
		if cfg, err = config.Parse(data, ""); err != nil {
			return fmt.Errorf("%s: %w", f.cfgPath, err)
		}
	} else {
		d := cfg.Default("")
		cfg = &d
	}
	a := NewOfflineAdmitter(cfg, facts, persistentIPsPreview(cfg, facts))
	a.Namespace = f.namespace
	for _, d := range docs {
		res, ok, err := a.Admit(c.Context(), d)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if err := emit(res); err != nil {
			return err
		}
	}
	return nil
}

func mutateCommand() *cobra.Command {
	return offlineCommand(&cobra.Command{
		Use:   "mutate -f FILE [--nads FILE] [--config FILE] [--kubevirt FILE]",
		Short: "Print VMs and VMIs as kvnet's webhook would store them, without a cluster",
		Long: `mutate runs every VirtualMachine and VirtualMachineInstance in the input
through kvnet's mutating and validating webhooks (the same code the server
runs) and prints the objects as the API server would store them. Warnings
and refusals go to stderr; refused objects are not printed.`,
	}, offlineOutput{
		notesToStderr: true,
		warning:       "Warning: %s: %s\n",
		refused:       "Error: %s: %s\n",
		admitted: func(out io.Writer, r offline.Result, n int) error {
			// The object, then what kvnet's controllers would create for it.
			for i, js := range append([][]byte{r.Mutated}, r.Related...) {
				y, err := offline.ToYAML(js)
				if err != nil {
					return err
				}
				if n > 0 || i > 0 {
					fmt.Fprintln(out, "---")
				}
				if _, err := out.Write(y); err != nil {
					return err
				}
			}
			return nil
		},
	})
}

func validateCommand() *cobra.Command {
	return offlineCommand(&cobra.Command{
		Use:   "validate -f FILE [--nads FILE] [--config FILE] [--kubevirt FILE]",
		Short: "Report the field errors and warnings kvnet would return; exit 1 when any object is refused",
	}, offlineOutput{
		warning: "%s: warning: %s\n",
		refused: "%s: invalid: %s\n",
		admitted: func(out io.Writer, r offline.Result, _ int) error {
			fmt.Fprintf(out, "%s: valid\n", r.Doc.Source)
			return nil
		},
	})
}

// offlineOutput is how an offline command reports each object of its input.
type offlineOutput struct {
	// notesToStderr sends the warnings and refusals to stderr rather than
	// stdout (mutate's stdout is the objects only).
	notesToStderr bool
	// warning and refused are the formats of one warning and of a refusal,
	// given the object's source and the message.
	warning, refused string
	// admitted prints an object kvnet admits; n counts those printed before.
	admitted func(out io.Writer, r offline.Result, n int) error
}

// offlineCommand gives c the body `kvnet mutate` and `kvnet validate`
// share: the offline flags, every object of the input admitted and reported
// as o says, and exit code 1 (errInvalid) when any object was refused.
func offlineCommand(c *cobra.Command, o offlineOutput) *cobra.Command {
	var f offlineFlags
	c.RunE = func(c *cobra.Command, _ []string) error {
		out, notes := c.OutOrStdout(), c.OutOrStdout()
		if o.notesToStderr {
			notes = c.ErrOrStderr()
		}
		admitted, denied := 0, false
		err := f.run(c, func(r offline.Result) error {
			for _, w := range r.Warnings {
				fmt.Fprintf(notes, o.warning, r.Doc.Source, w)
			}
			if r.Denied != "" {
				denied = true
				fmt.Fprintf(notes, o.refused, r.Doc.Source, r.Denied)
				return nil
			}
			admitted++
			return o.admitted(out, r, admitted-1)
		})
		if err == nil && denied {
			return errInvalid
		}
		return err
	}
	f.register(c)
	return c
}

// NewOfflineAdmitter runs documents through the VM and VMI handlers `kvnet
// webhook` serves, on the same chains, with cfg and facts (no capability
// that needs a cluster); related previews what controllers would create.
func NewOfflineAdmitter(cfg *config.Config, facts lookup.Facts, related ...offline.RelatedFunc) *offline.Admitter {
	hs := webhook.NewHandlers(config.Static(cfg), facts, Chains(Capabilities{}))
	return offline.NewAdmitter(map[string]offline.KindHandlers{
		string(chain.KindVM):  {Mutate: hs[webhook.PathMutateVM], Validate: hs[webhook.PathValidateVM], Resource: "virtualmachines"},
		string(chain.KindVMI): {Mutate: hs[webhook.PathMutateVMI], Validate: hs[webhook.PathValidateVMI], Resource: "virtualmachineinstances"},
	}, related...)
}
