package metrics

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The cached series are the vectors' own: every call lands in the series
// its labels name, and a step's error or denied series appears only once
// one happened.
func TestObserveWritesTheLabelledSeries(t *testing.T) {
	start := time.Now()
	for range 3 {
		ObserveStep("test-step", "VirtualMachine", start, nil, false)
	}
	if got := testutil.ToFloat64(stepCalls.WithLabelValues("test-step", "VirtualMachine", "ok")); got != 3 {
		t.Fatalf("ok calls = %v, want 3", got)
	}
	if n := testutil.CollectAndCount(stepCalls, "kvnet_step_calls_total"); n != 1 {
		t.Fatalf("%d series after successful calls only, want 1", n)
	}
	ObserveStep("test-step", "VirtualMachine", start, errors.New("boom"), false)
	ObserveStep("test-step", "VirtualMachine", start, nil, true)
	ObserveStep("test-step", "VirtualMachineInstance", start, nil, false)
	for _, c := range []struct {
		kind, result string
		want         float64
	}{{"VirtualMachine", "ok", 3}, {"VirtualMachine", "error", 1}, {"VirtualMachine", "denied", 1}, {"VirtualMachineInstance", "ok", 1}} {
		if got := testutil.ToFloat64(stepCalls.WithLabelValues("test-step", c.kind, c.result)); got != c.want {
			t.Errorf("%s %s = %v, want %v", c.kind, c.result, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(stepLatency, "kvnet_step_duration_seconds"); n != 2 {
		t.Fatalf("%d latency series, want one per step and kind", n)
	}

	ObserveRequest("mutate-test", "patched", start)
	ObserveRequest("mutate-test", "patched", start)
	ObserveRequest("mutate-test", "denied", start)
	if got := testutil.ToFloat64(Requests.WithLabelValues("mutate-test", "patched")); got != 2 {
		t.Fatalf("patched = %v, want 2", got)
	}
	if got := testutil.ToFloat64(Requests.WithLabelValues("mutate-test", "denied")); got != 1 {
		t.Fatalf("denied = %v, want 1", got)
	}
	if n := testutil.CollectAndCount(RequestLatency, "kvnet_admission_duration_seconds"); n != 1 {
		t.Fatalf("%d request latency series, want 1", n)
	}
}

// Registering the same collectors twice on one registry is a no-op, as
// several managers in one process do; another collector of a name already
// taken is an error, not a silent second series.
func TestRegister(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := RegisterMetrics(reg); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	if err := RegisterMetrics(reg); err != nil {
		t.Fatalf("second registration of the same collectors: %v", err)
	}
	// The same name and help, so the registry reports it as already
	// registered; Register must not take that for its own collector.
	other := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_admission_requests_total",
		Help: "Admission requests by webhook and outcome (allowed, patched, denied, bad-request, error; a request kvnet skips is allowed).",
	}, []string{"webhook", "outcome"})
	var dup prometheus.AlreadyRegisteredError
	if err := Register(reg, other); !errors.As(err, &dup) {
		t.Fatalf("another collector named kvnet_admission_requests_total: err = %v, want AlreadyRegisteredError", err)
	}
}
