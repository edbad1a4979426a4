package app

import (
	"crypto/tls"

	ctrl "sigs.k8s.io/controller-runtime"
)

// managerOptions are the manager settings every kvnet process (`kvnet
// webhook`, `kvnet proxy`) shares: kvnet's scheme, how it serves metrics
// (metrics; tlsOpts apply to its HTTPS listener) and probes, and leader
// election on the lease leaseName in namespace. Each caller adds what is
// its own (the webhook server, lease timings). The error names the metrics
// flag kvnet refuses.
func managerOptions(metrics MetricsServing, probeAddr string, leaderElect bool, leaseName, namespace string, tlsOpts ...func(*tls.Config)) (ctrl.Options, error) {
	mo, err := metrics.serverOptions(tlsOpts...)
	if err != nil {
		return ctrl.Options{}, err
	}
	return ctrl.Options{
		Scheme:                  Scheme(),
		Metrics:                 mo,
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        leaseName,
		LeaderElectionNamespace: namespace,
		// kvnet exits when its manager stops, so it releases the lease at
		// once instead of letting it run out (LeaseDuration): a rolling
		// update does not leave the controllers, or the proxy's relays,
		// without a leader for 15 seconds.
		LeaderElectionReleaseOnCancel: true,
	}, nil
}
