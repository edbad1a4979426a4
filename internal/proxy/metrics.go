package proxy

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvnet/kvnet/internal/metrics"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

var (
	connections = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_proxy_connections_total",
		Help: "Streams the migration proxy relayed (both sides).",
	})
	active = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_proxy_active_connections",
		Help: "Streams the migration proxy is relaying now.",
	})
	bytesRelayed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_proxy_bytes_total",
		Help: "Bytes relayed, by direction (to-target, from-target); updated at least every MiB while a stream runs.",
	}, []string{"direction"})
	// migrationBytes carries a migration ID label. IDs are unbounded, so a
	// migration's series are deleted when its last stream ends: at most
	// the cap's worth of migrations are ever exported at once.
	migrationBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_proxy_migration_bytes_total",
		Help: "Bytes relayed for a migration in flight, by side (source, target) and direction; removed when its last stream ends.",
	}, []string{"side", "migration_id", "direction"})
	dialErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_proxy_dial_errors_total",
		Help: "Streams closed because their upstream (the peer proxy or the target virt-handler) could not be reached.",
	})
	refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_proxy_refused_total",
		Help: "Streams refused, by side (source listener, target hop listener) and reason.",
	}, []string{"side", "reason"})
	acceptErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_proxy_accept_errors_total",
		Help: "Accept errors on proxy listeners (retried with backoff).",
	})
	listenerReopens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_proxy_listener_reopens_total",
		Help: "Proxy listeners that died and were reopened on the same address.",
	})
	idleTimeouts = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_proxy_idle_timeouts_total",
		Help: "Streams closed because no byte moved for the idle timeout.",
	})
	queued = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_proxy_queued_streams",
		Help: "Streams waiting for a migration slot (the cap or their namespace's share of it is taken).",
	})
	// pendingHandshakes is what an unauthenticated client holds of the
	// hop listener's MaxPendingHandshakes places: at the cap under a flood
	// of stalled handshakes, near zero otherwise, so an alert can tell a
	// flood from a quiet listener before the refusals say so.
	pendingHandshakes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_proxy_pending_handshakes",
		Help: "Connections to the hop listener whose TLS handshake is under way (not yet authenticated).",
	})
	listeners = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_proxy_listeners",
		Help: "Source-side listeners open for in-flight decentralized migrations.",
	})
)

// RegisterMetrics registers the proxy's metrics on reg: its relays', its
// migration bindings' and its CA exchange's.
func RegisterMetrics(reg prometheus.Registerer) error {
	// Both directions exist from the start, so a dashboard's rate() of
	// the first migration starts from zero.
	bytesRelayed.WithLabelValues("to-target")
	bytesRelayed.WithLabelValues("from-target")
	// Every refusal reason exists from the start too: the first over-cap
	// or untrusted-peer refusal must move increase() for the alerts.
	for _, r := range hop.RefusalCodes() {
		for _, side := range []string{"source", "target"} {
			refused.WithLabelValues(side, r.String())
		}
	}
	identitiesOffered.WithLabelValues("accepted")
	return metrics.Register(reg, connections, active, bytesRelayed, migrationBytes, dialErrors, refused,
		acceptErrors, listenerReopens, idleTimeouts, queued, pendingHandshakes, listeners, caReloads, bindingsHeld, identitiesOffered, leasesMarked, leaseChecks)
}

// streamCounters is one stream's handle on its migration's series.
type streamCounters struct {
	side, id string
	up, down prometheus.Counter
}

var (
	countersMu sync.Mutex
	countersRC = map[[2]string]int{}
)

func migrationCounters(side, id string) *streamCounters {
	if id == "" {
		id = "unknown"
	}
	countersMu.Lock()
	countersRC[[2]string{side, id}]++
	countersMu.Unlock()
	return &streamCounters{side: side, id: id,
		up:   migrationBytes.WithLabelValues(side, id, "to-target"),
		down: migrationBytes.WithLabelValues(side, id, "from-target"),
	}
}

func (c *streamCounters) add(direction string, n int64) {
	bytesRelayed.WithLabelValues(direction).Add(float64(n))
	if direction == "to-target" {
		c.up.Add(float64(n))
	} else {
		c.down.Add(float64(n))
	}
}

func (c *streamCounters) release() {
	countersMu.Lock()
	defer countersMu.Unlock()
	k := [2]string{c.side, c.id}
	if countersRC[k]--; countersRC[k] > 0 {
		return
	}
	delete(countersRC, k)
	migrationBytes.DeleteLabelValues(c.side, c.id, "to-target")
	migrationBytes.DeleteLabelValues(c.side, c.id, "from-target")
}
