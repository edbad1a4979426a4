package validators_test

import (
	"context"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/lookup"
	"github.com/kvnet/kvnet/internal/model/migrationid"
	"github.com/kvnet/kvnet/validators"
)

func TestMigrationRoutes(t *testing.T) {
	target, source := migrationid.AnnotationTarget, migrationid.AnnotationSource
	for name, c := range map[string]struct {
		recv, send string
		key, value string
		want       string // "" admitted; else in the error
	}{
		"no annotation":                 {recv: "mig-1"},
		"a sending VMIM names its VM":   {send: "mig-1", key: target, value: "team-a-prod/db-1"},
		"a receiving VMIM approves one": {recv: "mig-1", key: source, value: "cluster-a/team-a/db"},
		"target without a name":         {send: "mig-1", key: target, value: "team-a-prod", want: `metadata.annotations[kvnet.io/migration-target]: Invalid value: "team-a-prod": want <namespace>/<name>`},
		"target with a bad namespace":   {send: "mig-1", key: target, value: "Team/db", want: `namespace "Team"`},
		"target on a receiving VMIM":    {recv: "mig-1", key: target, value: "team-a/db", want: "metadata.annotations[kvnet.io/migration-target]: Forbidden: only a sending"},
		"source without a peer":         {recv: "mig-1", key: source, value: "team-a/db", want: `"db" is not <namespace>/<name>`},
		"source with an empty peer":     {recv: "mig-1", key: source, value: "/team-a/db", want: "is not <peer>/<namespace>/<name>"},
		"source on a sending VMIM":      {send: "mig-1", key: source, value: "cluster-a/team-a/db", want: "metadata.annotations[kvnet.io/migration-source]: Forbidden: only a receiving"},
	} {
		t.Run(name, func(t *testing.T) {
			m := vmim("tenant", "vm1-x", c.recv, c.send, "")
			if c.key != "" {
				m.Annotations = map[string]string{c.key: c.value}
			}
			req := &chain.MigrationRequest{Namespace: m.Namespace, Name: m.Name, Migration: &m, Config: defaultConfig, Facts: &lookup.Snapshot{}}
			errs, err := validators.MigrationRoutes{}.ValidateMigration(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			switch got := errs.ToAggregate(); {
			case c.want == "" && got != nil:
				t.Errorf("refused: %v", got)
			case c.want != "" && (got == nil || !strings.Contains(got.Error(), c.want)):
				t.Errorf("got %v, want an error saying %q", got, c.want)
			}
		})
	}
}
