package app

import (
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// managerOptions are the manager settings every kvnet process (`kvnet
// webhook`, `kvnet proxy`) shares: kvnet's scheme, where it serves metrics
// and probes, and leader election on the lease leaseName in namespace. Each
// caller adds what is its own (the webhook server, lease timings).
func managerOptions(metricsAddr, probeAddr string, leaderElect bool, leaseName, namespace string) ctrl.Options {
	return ctrl.Options{
		Scheme:                  Scheme(),
		Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        leaseName,
		LeaderElectionNamespace: namespace,
		// kvnet exits when its manager stops, so it releases the lease at
		// once instead of letting it run out (LeaseDuration): a rolling
		// update does not leave the controllers, or the proxy's relays,
		// without a leader for 15 seconds.
		LeaderElectionReleaseOnCancel: true,
	}
}
