package webhook

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/metrics"

	"github.com/kvnet/kvnet/internal/config"
)

// The pod webhooks the Registrar manages, and the one it copies the
// client configuration from. It never touches any other webhook.
const (
	launcherPodsWebhook  = "launcher-pods.mutate.kvnet.io"
	migrationPodsWebhook = "migration-pods.mutate.kvnet.io"
	vmMutateWebhook      = "virtualmachines.mutate.kvnet.io"
)

var (
	registrationChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_webhook_registration_changes_total",
		Help: "Pod webhooks added to or removed from kvnet's MutatingWebhookConfiguration because the config in force needs them or no longer does.",
	}, []string{"webhook", "action"})
	registrationErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvnet_webhook_registration_errors_total",
		Help: "Failed attempts to bring the pod webhooks in step with the config; each is retried.",
	})
)

// RegisterMetrics registers the webhook registrar's metrics on reg.
func RegisterMetrics(reg prometheus.Registerer) error {
	return metrics.Register(reg, registrationChanges, registrationErrors)
}

// Registrar keeps the pod webhooks of kvnet's MutatingWebhookConfiguration
// in step with the config in force. The pod webhooks fail closed, so they are
// registered only while a configured feature needs them (Registration.For);
// the chart renders them from its values, but the config file can change
// without a `helm upgrade` (an edited ConfigMap, a GitOps tool that owns only
// the ConfigMap). Without the Registrar, enabling persistent IPs that way
// would silently give VMs new IPs, and disabling them would leave a webhook
// that stops every launcher pod while kvnet is down.
//
// It adds or removes only the launcher-pods and migration-pods webhooks,
// leaving an entry that already exists as it is (the chart's rendering
// wins). A webhook it adds takes its client configuration (Service or URL,
// CA bundle) and namespace selector from the VM webhook of the same
// configuration, so it reaches the same kvnet the same way, with the path
// of its own handler. Helm's three-way merge keeps entries it did not
// render, so a later upgrade does not undo the Registrar's work.
type Registrar struct {
	// Name is the MutatingWebhookConfiguration's name.
	Name string
	// Reader reads the configuration from the API server (not a cache: one
	// object, read every Interval, is not worth a cluster-wide watch).
	Reader client.Reader
	// Writer updates it, with the resourceVersion read as a precondition.
	Writer client.Writer
	Config *config.Source
	Log    logr.Logger
	// Interval is how often the config in force is compared with the last
	// one synced, and failed syncs retried; default 2s. A full resync, which
	// repairs a configuration edited by hand, runs every Resync; default 5m.
	Interval, Resync time.Duration
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: one replica
// writes, so two replicas that briefly disagree about the config (a kubelet
// that has not yet updated one pod's volume) do not flap the registration.
func (r *Registrar) NeedLeaderElection() bool { return true }

// Start syncs at once, then whenever the config in force changes, retrying
// failures every Interval. It returns when ctx ends.
func (r *Registrar) Start(ctx context.Context) error {
	interval, resync := r.Interval, r.Resync
	if interval <= 0 {
		interval = 2 * time.Second
	}
	if resync <= 0 {
		resync = 5 * time.Minute
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var synced *config.Config
	var syncedAt time.Time
	for {
		if c := r.Config.Get(); c != synced || time.Since(syncedAt) >= resync {
			if err := r.Sync(ctx, c); err != nil {
				registrationErrors.Inc()
				r.Log.Error(err, "keeping the pod webhooks in step with the config failed; retrying", "configuration", r.Name)
			} else {
				synced, syncedAt = c, time.Now()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Sync makes the configuration's pod webhooks those c needs. A conflict
// (someone else wrote in between) is an error; the next attempt reads again.
func (r *Registrar) Sync(ctx context.Context, c *config.Config) error {
	var mwc admissionregv1.MutatingWebhookConfiguration
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: r.Name}, &mwc); err != nil {
		return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", r.Name, err)
	}
	added, removed, err := PodWebhooks(&mwc, c)
	if err != nil {
		return err
	}
	if len(added)+len(removed) == 0 {
		return nil
	}
	if err := r.Writer.Update(ctx, &mwc); err != nil {
		return fmt.Errorf("updating MutatingWebhookConfiguration %s (adding %v, removing %v): %w", r.Name, added, removed, err)
	}
	for _, n := range added {
		registrationChanges.WithLabelValues(n, "added").Inc()
	}
	for _, n := range removed {
		registrationChanges.WithLabelValues(n, "removed").Inc()
	}
	r.Log.Info("pod webhooks follow the config", "configuration", r.Name, "added", added, "removed", removed)
	return nil
}

// PodWebhooks edits mwc in place so that it holds exactly the pod webhooks c
// needs, and says which it added and removed. It is the Registrar's pure
// core, and `kvnet` never calls it on a configuration without kvnet's VM
// webhook, which every install has and new entries are modelled on.
func PodWebhooks(mwc *admissionregv1.MutatingWebhookConfiguration, c *config.Config) (added, removed []string, err error) {
	i := slices.IndexFunc(mwc.Webhooks, func(w admissionregv1.MutatingWebhook) bool { return w.Name == vmMutateWebhook })
	if i < 0 {
		return nil, nil, fmt.Errorf("MutatingWebhookConfiguration %s has no webhook %s to model the pod webhooks on; is it kvnet's?", mwc.Name, vmMutateWebhook)
	}
	model := mwc.Webhooks[i]
	want := Registration{}.For(c)
	desired, _ := want.Configurations()
	need := map[string]bool{launcherPodsWebhook: want.LauncherPods, migrationPodsWebhook: want.MigrationPods}

	kept := mwc.Webhooks[:0]
	have := map[string]bool{}
	for _, w := range mwc.Webhooks {
		if wanted, managed := need[w.Name]; managed && !wanted {
			removed = append(removed, w.Name)
			continue
		}
		have[w.Name] = true
		kept = append(kept, w)
	}
	mwc.Webhooks = kept
	for _, w := range desired.Webhooks {
		if !need[w.Name] || have[w.Name] {
			continue
		}
		cc, err := clientConfigFor(model.ClientConfig, w.ClientConfig)
		if err != nil {
			return nil, nil, fmt.Errorf("MutatingWebhookConfiguration %s, webhook %s: %w", mwc.Name, vmMutateWebhook, err)
		}
		w.ClientConfig = cc
		w.NamespaceSelector = model.NamespaceSelector.DeepCopy()
		w.FailurePolicy, w.TimeoutSeconds = model.FailurePolicy, model.TimeoutSeconds
		mwc.Webhooks = append(mwc.Webhooks, w)
		added = append(added, w.Name)
	}
	return added, removed, nil
}

// clientConfigFor is model's client configuration (same Service or URL, same
// CA bundle) with the path of want, the handler the new webhook calls.
func clientConfigFor(model, want admissionregv1.WebhookClientConfig) (admissionregv1.WebhookClientConfig, error) {
	out := *model.DeepCopy()
	path := ""
	if want.Service != nil && want.Service.Path != nil {
		path = *want.Service.Path
	}
	switch {
	case out.Service != nil:
		out.Service.Path = &path
	case out.URL != nil:
		u, err := url.Parse(*out.URL)
		if err != nil {
			return out, fmt.Errorf("clientConfig.url %q: %w", *out.URL, err)
		}
		u.Path = path
		s := u.String()
		out.URL = &s
	default:
		return out, fmt.Errorf("clientConfig has neither service nor url")
	}
	return out, nil
}
