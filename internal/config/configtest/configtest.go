// Package configtest loads the policies unit tests run with.
package configtest

import (
	"testing"

	"github.com/kvnet/kvnet/internal/config"
)

// Must parses yaml as kvnet does when it loads its config, kvnet running
// in namespace, and fails t when kvnet would refuse it.
func Must(t testing.TB, yaml, namespace string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(yaml), namespace)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}
