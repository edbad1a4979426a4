// Package metrics defines kvnet's Prometheus metrics. They are registered on
// controller-runtime's registry, so the manager serves them on its metrics port.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	stepCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_step_calls_total",
		Help: "Calls of each mutator or validator, by object kind and result (ok, denied, error).",
	}, []string{"step", "kind", "result"})
	stepLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_step_duration_seconds",
		Help:    "Time spent in each mutator or validator.",
		Buckets: []float64{1e-6, 5e-6, 25e-6, 1e-4, 5e-4, 2.5e-3, 1e-2, 5e-2, 0.25, 1},
	}, []string{"step", "kind"})
	// Requests counts admission requests per webhook and outcome.
	Requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_admission_requests_total",
		Help: "Admission requests by webhook and outcome (allowed, patched, denied, error, skipped).",
	}, []string{"webhook", "outcome"})
	// RequestLatency is the whole handler's latency per webhook. The
	// buckets reach the API server's longest webhook timeout (30s), so a
	// p99 against the configured timeout is measured, not capped at 1s.
	RequestLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvnet_admission_duration_seconds",
		Help:    "Time from decoding the AdmissionReview to the response, per webhook.",
		Buckets: []float64{5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.25, 1, 2.5, 5, 10, 30},
	}, []string{"webhook"})
)

func init() {
	metrics.Registry.MustRegister(stepCalls, stepLatency, Requests, RequestLatency)
}

// ObserveStep records one mutator or validator call.
func ObserveStep(step, kind string, start time.Time, err error, denied bool) {
	result := "ok"
	switch {
	case err != nil:
		result = "error"
	case denied:
		result = "denied"
	}
	stepCalls.WithLabelValues(step, kind, result).Inc()
	stepLatency.WithLabelValues(step, kind).Observe(time.Since(start).Seconds())
}
