package migration

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/metrics"

	"github.com/kvnet/kvnet/internal/config"
)

var (
	denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_migration_denials_total",
		Help: "Migration pods denied, by pool and reason (exhausted, nad-missing, bad-annotation).",
	}, []string{"pool", "reason"})
	// notHolders counts pods that carry KubeVirt's migration labels but
	// not a holder's namespace and ServiceAccount: a tenant's look-alike,
	// or a holder list that misses a real component.
	notHolders = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_migration_not_holder_pods_total",
		Help: "Pods with KubeVirt's migration labels left without migration addresses or sidecar because their namespace or ServiceAccount is not a configured holder's, by reason (namespace, service-account, no-kubevirt-namespace).",
	}, []string{"reason"})
	releases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_migration_releases_total",
		Help: "Allocations released by the controller, by pool and reason (pod-gone, reservation-expired, node-gone, surplus, outside-pool).",
	}, []string{"pool", "reason"})

	// malformedSkips counts what the allocator would otherwise pass over
	// in silence: an allocation it meant to take over whose ConfigMap no
	// longer parses when re-read. Leaving it alone is right (whoever
	// edited it may hold the address), but only a person can fix it.
	malformedSkips = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_migration_malformed_allocations_skipped_total",
		Help: "Allocations the allocator left alone at admission because their ConfigMap did not parse when re-read from the API server, by pool; the address stays out of use until the ConfigMap is fixed or deleted.",
	}, []string{"pool"})

	sidecarInjected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_migration_proxy_sidecars_injected_total",
		Help: "Migration proxy sidecars injected into synchronization-controller pods.",
	})
	sidecarRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_migration_proxy_sidecar_refusals_total",
		Help: "Synchronization-controller pods refused because the proxy sidecar could not be injected, by reason (volume-name-taken).",
	}, []string{"reason"})

	configProblems = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_migration_config_problems",
		Help: "Errors found the last time the migration config was checked against the cluster (missing NADs, too few cross-cluster addresses).",
	})

	poolSize    = prometheus.NewDesc("kvnet_migration_pool_size", "Addresses in the configured pool.", []string{"pool"}, nil)
	poolUsed    = prometheus.NewDesc("kvnet_migration_pool_used", "Addresses with an allocation (bound, reserved or idle for a node).", []string{"pool"}, nil)
	poolPending = prometheus.NewDesc("kvnet_migration_reservations_pending", "Allocations reserved at admission whose pod has not been seen yet.", []string{"pool"}, nil)
	poolIdle    = prometheus.NewDesc("kvnet_migration_pool_idle", "In-cluster addresses kept for a node whose virt-handler is away.", []string{"pool"}, nil)
)

// gauges computes the pool gauges at scrape time from the allocation cache
// of a running capability, so they are never stale and need no bookkeeping
// on every write. A process normally runs one; tests run a second replica,
// which must not leave its stopped cache behind as the source.
type gauges struct {
	mu      sync.Mutex
	sources []*gaugeSource
}

// run makes src the source while ctx (a manager's lifetime) lasts.
func (g *gauges) run(ctx context.Context, src *gaugeSource) error {
	g.mu.Lock()
	g.sources = append(g.sources, src)
	g.mu.Unlock()
	<-ctx.Done()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, s := range g.sources {
		if s == src {
			g.sources = append(g.sources[:i], g.sources[i+1:]...)
			break
		}
	}
	return nil
}

func (g *gauges) current() *gaugeSource {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.sources) == 0 {
		return nil
	}
	return g.sources[0]
}

type gaugeSource struct {
	reader    client.Reader
	namespace string
	config    *config.Source
}

var poolGauges = &gauges{}

// RegisterMetrics registers the migration networks' metrics on reg: the
// allocators', the sidecar injection's and the pools' gauges.
func RegisterMetrics(reg prometheus.Registerer) error {
	// Exhaustion denials and releases of both pools exist from the start,
	// so the first one is an increase that an alert's increase() sees.
	for _, pool := range []string{PoolInCluster, PoolCrossCluster} {
		denials.WithLabelValues(pool, "exhausted")
		malformedSkips.WithLabelValues(pool)
		for _, reason := range []string{"pod-gone", "reservation-expired", "node-gone", "surplus", "outside-pool"} {
			releases.WithLabelValues(pool, reason)
		}
	}
	return metrics.Register(reg, denials, notHolders, releases, malformedSkips, sidecarInjected, sidecarRefused, configProblems, poolGauges)
}

// ValueType is the type of every series g exports, for the generated
// metrics reference (docs/metrics.md).
func (g *gauges) ValueType() prometheus.ValueType { return prometheus.GaugeValue }

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolSize
	ch <- poolUsed
	ch <- poolPending
	ch <- poolIdle
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	src := g.current()
	if src == nil {
		return
	}
	cfg := src.config.Get()
	if cfg == nil {
		return
	}
	m := &cfg.Migration
	if m.InCluster != nil {
		ch <- prometheus.MustNewConstMetric(poolSize, prometheus.GaugeValue, inClusterNetwork(m).Pool.Pool.SizeFloat(), PoolInCluster)
	}
	if m.CrossCluster != nil {
		ch <- prometheus.MustNewConstMetric(poolSize, prometheus.GaugeValue, crossClusterNetwork(m).Pool.Pool.SizeFloat(), PoolCrossCluster)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	all, err := listAllocations(ctx, src.reader, src.namespace, "", nil)
	if err != nil {
		return
	}
	for _, pool := range []string{PoolInCluster, PoolCrossCluster} {
		var used, pending, idle float64
		for _, a := range all {
			if a.Pool != pool {
				continue
			}
			used++
			switch a.State {
			case StateReserved:
				pending++
			case StateIdle:
				idle++
			}
		}
		ch <- prometheus.MustNewConstMetric(poolUsed, prometheus.GaugeValue, used, pool)
		ch <- prometheus.MustNewConstMetric(poolPending, prometheus.GaugeValue, pending, pool)
		ch <- prometheus.MustNewConstMetric(poolIdle, prometheus.GaugeValue, idle, pool)
	}
}
