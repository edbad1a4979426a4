package test

import "testing"

// useConfig swaps kvnet's policy for the test and restores it after.
func useConfig(t *testing.T, yaml string) {
	t.Helper()
	restore, err := env.SetConfig(yaml)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	t.Cleanup(restore)
}
