package framework

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Eventually polls cond until it returns nil, failing the test with cond's
// last error once timeout has passed. It is the one poll loop of kvnet's
// tests: a condition with a generous deadline, never a sleep and never a
// timing assertion.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		last = cond()
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s: still not true after %s: %v", what, timeout, last)
	}
}
