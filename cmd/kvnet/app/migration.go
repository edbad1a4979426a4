package app

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/migration"
)

// migrationNetworks adds the migration-address controller to the manager
// and returns the migration-pod steps around its allocator.
func migrationNetworks(ctx context.Context, mgr manager.Manager, cfg *config.Source, namespace string) (MigrationSteps, error) {
	c, err := migration.Setup(ctx, mgr, cfg, namespace)
	if err != nil {
		return MigrationSteps{}, fmt.Errorf("setting up migration networks: %w", err)
	}
	return migrationSteps(c.Mutator), nil
}

// migrationIPsCommand prints the allocation table from the cluster and, with
// --config, checks that config against the cluster.
func migrationIPsCommand() *cobra.Command {
	var kubeconfig, namespace, cfgPath string
	c := &cobra.Command{
		Use:   "migration-ips",
		Short: "Print the migration-network address allocations kvnet holds in the cluster",
		Long: `Reads kvnet's allocation objects (ConfigMaps labelled kvnet.io/migration-pool in
kvnet's namespace) and prints one line per address: pool, address, state
(reserved, bound, idle), node, pod and reservation age. With --config it also
checks that policy against the cluster (NADs exist, enough cross-cluster
addresses for the holder replicas) and exits 1 on errors.`,
		RunE: func(c *cobra.Command, _ []string) error {
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = kubeconfig
			restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
			if err != nil {
				return fmt.Errorf("finding the cluster: %w", err)
			}
			cl, err := client.New(restCfg, client.Options{Scheme: Scheme()})
			if err != nil {
				return err
			}
			return runMigrationIPs(c.Context(), cl, namespace, cfgPath, c)
		},
	}
	def := os.Getenv("POD_NAMESPACE")
	if def == "" {
		def = migration.DefaultNamespace
	}
	c.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config or in-cluster)")
	c.Flags().StringVarP(&namespace, "namespace", "n", def, "kvnet's namespace, where the allocations live")
	c.Flags().StringVar(&cfgPath, "config", "", "kvnet policy file to check against the cluster")
	return c
}

func runMigrationIPs(ctx context.Context, r client.Reader, namespace, cfgPath string, c *cobra.Command) error {
	allocs, err := migration.ReadTable(ctx, r, namespace)
	if err != nil {
		return err
	}
	if err := migration.WriteTable(c.OutOrStdout(), allocs, time.Now()); err != nil {
		return err
	}
	if cfgPath == "" {
		return nil
	}
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		return fmt.Errorf("reading config: %w", err)
	}
	cfg, err := config.Parse(data, namespace)
	if err != nil {
		return err
	}
	errs, warnings, err := migration.CheckCluster(ctx, r, &cfg.Migration)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		fmt.Fprintln(c.ErrOrStderr(), "warning:", w)
	}
	for _, e := range errs {
		fmt.Fprintln(c.ErrOrStderr(), "invalid:", e.Error())
	}
	if len(errs) > 0 {
		return errInvalid
	}
	return nil
}
