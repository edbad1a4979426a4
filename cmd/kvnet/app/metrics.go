package app

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/metrics"
	"github.com/kvnet/kvnet/internal/migration"
	"github.com/kvnet/kvnet/internal/persistentips"
	"github.com/kvnet/kvnet/internal/proxy"
	"github.com/kvnet/kvnet/internal/proxy/caexchange"
	"github.com/kvnet/kvnet/mutators"
	"github.com/kvnet/kvnet/webhook"
)

// RegisterMetrics registers every kvnet metric on reg, whichever capability
// this process runs: a series kvnet declares is on /metrics from the start,
// at zero, so the alerts' increase() sees its first change
// (test/monitoring checks what the rules read against what is declared).
// Registering again on the same registry is a no-op (metrics.Register).
func RegisterMetrics(reg prometheus.Registerer) error {
	return errors.Join(
		metrics.RegisterMetrics(reg),
		config.RegisterMetrics(reg),
		webhook.RegisterMetrics(reg),
		mutators.RegisterMetrics(reg),
		certs.RegisterMetrics(reg),
		migration.RegisterMetrics(reg),
		persistentips.RegisterMetrics(reg),
		proxy.RegisterMetrics(reg),
		caexchange.RegisterMetrics(reg),
	)
}
