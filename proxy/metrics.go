package proxy

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The relay's metrics have no per-migration labels: migration IDs are
// unbounded, and the logs carry them.
var (
	connections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_proxy_connections_total",
		Help: "Connections the migration proxy accepted.",
	})
	active = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_proxy_active_connections",
		Help: "Connections the migration proxy is relaying now.",
	})
	bytesRelayed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_proxy_bytes_total",
		Help: "Bytes relayed, by direction (to-target, from-target); added when a direction ends.",
	}, []string{"direction"})
	dialErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_proxy_dial_errors_total",
		Help: "Connections closed because the remote migration target could not be dialed.",
	})
	listeners = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_proxy_listeners",
		Help: "Relay listeners open for in-flight decentralized migrations.",
	})
)

func init() {
	// Both directions exist from the start, so a dashboard's rate() of
	// the first migration starts from zero.
	bytesRelayed.WithLabelValues("to-target")
	bytesRelayed.WithLabelValues("from-target")
	metrics.Registry.MustRegister(connections, active, bytesRelayed, dialErrors, listeners)
}
