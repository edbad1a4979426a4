package certs

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvnet/kvnet/internal/metrics"
)

var (
	// expiry lets an alert fire well before a certificate this replica
	// serves or trusts runs out, whatever went wrong with renewal.
	expiry = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_cert_expiry_timestamp_seconds",
		Help: "NotAfter of the certificate this replica serves (cert=serving) and of the CA that signed it (cert=ca), as a Unix time.",
	}, []string{"cert"})
	// rotations counts writes of new material to the Secret by this replica.
	rotations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_cert_rotations_total",
		Help: "New certificate material this replica wrote to the Secret, by reason (created, serving-renewed, serving-reissued, ca-staged, ca-promoted, invalid).",
	}, []string{"reason"})
	// reconcileErrors counts failed passes; the next pass retries.
	reconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_cert_reconcile_errors_total",
		Help: "Failed certificate passes by step (secret, inject, files); the next pass retries.",
	}, []string{"step"})
	// reloads counts key pairs this replica wrote to its cert dir.
	reloads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_cert_file_updates_total",
		Help: "Times this replica wrote a new key pair into the webhook server's cert dir.",
	})
	// injections counts CA bundle writes into webhook configurations.
	injections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_cert_ca_injections_total",
		Help: "Webhook configurations this replica updated with a new CA bundle.",
	})
)

// RegisterMetrics registers the certificate metrics on reg.
func RegisterMetrics(reg prometheus.Registerer) error {
	// Every step exists from the start at 0, so the first failure is an
	// increase a rate() or increase() sees.
	for _, step := range []string{"secret", "inject", "files"} {
		reconcileErrors.WithLabelValues(step)
	}
	return metrics.Register(reg, expiry, rotations, reconcileErrors, reloads, injections)
}

// RotationCount reads kvnet_cert_rotations_total{reason}, for tests that
// count which replica created or renewed what.
func RotationCount(reason string) float64 {
	var m dto.Metric
	if err := rotations.WithLabelValues(reason).Write(&m); err != nil {
		return 0
	}
	return m.GetCounter().GetValue()
}
