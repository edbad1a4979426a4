// Package metrics defines kvnet's admission metrics, and Register, through
// which every package's RegisterMetrics puts its collectors on the registry
// cmd/kvnet/app gives it (controller-runtime's, which the manager serves on
// its metrics port).
package metrics

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
		Help: "Admission requests by webhook and outcome (allowed, patched, denied, bad-request, error; a request kvnet skips is allowed).",
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

// RegisterMetrics registers the admission metrics on reg.
func RegisterMetrics(reg prometheus.Registerer) error {
	return Register(reg, stepCalls, stepLatency, Requests, RequestLatency)
}

// Register registers cs on reg, each package's RegisterMetrics through it.
// A collector already registered on reg is left as it is: a process may
// set up more than one manager (the tests start several kvnets in one
// process), and each setup registers what it serves. Any other conflict,
// two collectors of one name, is an error.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	var errs []error
	for _, c := range cs {
		err := reg.Register(c)
		var dup prometheus.AlreadyRegisteredError
		if err != nil && !(errors.As(err, &dup) && dup.ExistingCollector == c) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ObserveStep records one mutator or validator call.
func ObserveStep(step, kind string, start time.Time, err error, denied bool) {
	s := steps.get([2]string{step, kind}, func() stepSeries {
		return stepSeries{ok: stepCalls.WithLabelValues(step, kind, "ok"), latency: stepLatency.WithLabelValues(step, kind)}
	})
	switch {
	case err != nil:
		stepCalls.WithLabelValues(step, kind, "error").Inc()
	case denied:
		stepCalls.WithLabelValues(step, kind, "denied").Inc()
	default:
		s.ok.Inc()
	}
	s.latency.Observe(time.Since(start).Seconds())
}

// ObserveRequest records one admission request's outcome and latency.
func ObserveRequest(webhook, outcome string, start time.Time) {
	requests.get([2]string{webhook, outcome}, func() prometheus.Counter {
		return Requests.WithLabelValues(webhook, outcome)
	}).Inc()
	latencies.get([2]string{webhook}, func() prometheus.Observer {
		return RequestLatency.WithLabelValues(webhook)
	}).Observe(time.Since(start).Seconds())
}

// The series the hot path writes, resolved once per label values:
// WithLabelValues hashes the values and takes the vector's lock on every
// call, about a dozen times per request. Only successful steps' counters
// are cached, so a series for "error" or "denied" still appears only once
// one happened.
var (
	steps     seriesCache[stepSeries]
	requests  seriesCache[prometheus.Counter]
	latencies seriesCache[prometheus.Observer]
)

type stepSeries struct {
	ok      prometheus.Counter
	latency prometheus.Observer
}

// seriesCache maps label values to the series resolve returns for them.
// A map under a read lock rather than a sync.Map, whose any-typed key
// would cost an allocation per lookup.
type seriesCache[T any] struct {
	mu sync.RWMutex
	m  map[[2]string]T
}

func (c *seriesCache[T]) get(key [2]string, resolve func() T) T {
	c.mu.RLock()
	v, ok := c.m[key]
	c.mu.RUnlock()
	if ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.m[key]; ok {
		return v
	}
	if c.m == nil {
		c.m = map[[2]string]T{}
	}
	v = resolve()
	c.m[key] = v
	return v
}
