package webhook

import (
	"slices"
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"

	"github.com/kvnet/kvnet/internal/config"
)

func parseConfig(t *testing.T, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(yaml), "kvnet-system")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const (
	noPodFeatures  = "persistentIPs:\n  enabled: false\nresources:\n  inject: never\n"
	allPodFeatures = `migration:
  inCluster:
    nad: kvnet-system/migration
    pool:
      cidr: 10.91.0.0/24
`
)

func names(mwc *admissionregv1.MutatingWebhookConfiguration) []string {
	var out []string
	for _, w := range mwc.Webhooks {
		out = append(out, w.Name)
	}
	return out
}

func TestPodWebhooksFollowTheConfig(t *testing.T) {
	reg := Registration{Name: "kvnet", ServiceNamespace: "kvnet-system", ServiceName: "kvnet", ServicePort: 443,
		CABundle: []byte("bundle"), ExcludedNamespaces: []string{"kube-system", "kvnet-system"}, MigrationProxy: true}
	off, on := parseConfig(t, noPodFeatures), parseConfig(t, allPodFeatures)

	// The chart rendered no pod webhooks; the config now needs both.
	mwc, _ := reg.For(off).Configurations()
	added, removed, err := PodWebhooks(mwc, on)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(added, []string{launcherPodsWebhook, migrationPodsWebhook}) || len(removed) != 0 {
		t.Fatalf("added %v, removed %v; want both pod webhooks added", added, removed)
	}
	// What was added is what the chart would have rendered for this config.
	want, _ := reg.For(on).Configurations()
	for _, name := range added {
		got, exp := find(t, mwc, name), find(t, want, name)
		if got.ClientConfig.Service == nil || *got.ClientConfig.Service.Path != *exp.ClientConfig.Service.Path ||
			got.ClientConfig.Service.Name != "kvnet" || string(got.ClientConfig.CABundle) != "bundle" {
			t.Errorf("%s: client config %+v, want the VM webhook's Service and bundle with path %s", name, got.ClientConfig, *exp.ClientConfig.Service.Path)
		}
		if !slices.Equal(got.NamespaceSelector.MatchExpressions[0].Values, []string{"kube-system", "kvnet-system"}) {
			t.Errorf("%s: namespace selector %+v, want the VM webhook's", name, got.NamespaceSelector)
		}
		if got.ObjectSelector.String() != exp.ObjectSelector.String() || len(got.Rules) != len(exp.Rules) {
			t.Errorf("%s: selectors or rules differ from Registration's", name)
		}
	}
	// The proxy's webhook and the VM/VMI ones are untouched, in order.
	if got := names(mwc)[:3]; !slices.Equal(got, []string{vmMutateWebhook, "virtualmachineinstances.mutate.kvnet.io", "vmi-migration-status.mutate.kvnet.io"}) {
		t.Errorf("other webhooks: %v", got)
	}

	// Idempotent: nothing more to do.
	if added, removed, err := PodWebhooks(mwc, on); err != nil || len(added)+len(removed) != 0 {
		t.Fatalf("second sync: added %v, removed %v, %v", added, removed, err)
	}

	// Back off: both go, nothing else does.
	added, removed, err = PodWebhooks(mwc, off)
	if err != nil || len(added) != 0 || !slices.Equal(removed, []string{launcherPodsWebhook, migrationPodsWebhook}) {
		t.Fatalf("added %v, removed %v, %v; want both pod webhooks removed", added, removed, err)
	}
	if got := names(mwc); len(got) != 3 {
		t.Errorf("left %v", got)
	}
}

func TestPodWebhooksKeepTheChartsRendering(t *testing.T) {
	on := parseConfig(t, allPodFeatures)
	mwc, _ := Registration{Name: "kvnet", ServiceName: "kvnet", ServiceNamespace: "ns"}.For(on).Configurations()
	// An admin tuned the rendered launcher-pods webhook; kvnet leaves it so.
	find(t, mwc, launcherPodsWebhook).TimeoutSeconds = ptr.To[int32](25)
	if added, removed, err := PodWebhooks(mwc, on); err != nil || len(added)+len(removed) != 0 {
		t.Fatalf("added %v, removed %v, %v", added, removed, err)
	}
	if got := *find(t, mwc, launcherPodsWebhook).TimeoutSeconds; got != 25 {
		t.Errorf("timeoutSeconds = %d, want the existing 25", got)
	}
}

func TestPodWebhooksByURL(t *testing.T) {
	off, on := parseConfig(t, noPodFeatures), parseConfig(t, allPodFeatures)
	mwc, _ := Registration{Name: "kvnet"}.For(off).Configurations()
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig = admissionregv1.WebhookClientConfig{URL: ptr.To("https://127.0.0.1:9443" + *mwc.Webhooks[i].ClientConfig.Service.Path)}
	}
	if _, _, err := PodWebhooks(mwc, on); err != nil {
		t.Fatal(err)
	}
	if got := *find(t, mwc, launcherPodsWebhook).ClientConfig.URL; got != "https://127.0.0.1:9443"+PathMutateLauncherPods {
		t.Errorf("url = %s", got)
	}
}

func TestPodWebhooksRefuseAForeignConfiguration(t *testing.T) {
	mwc := &admissionregv1.MutatingWebhookConfiguration{Webhooks: []admissionregv1.MutatingWebhook{{Name: "other.example.com"}}}
	mwc.Name = "someone-elses"
	_, _, err := PodWebhooks(mwc, parseConfig(t, allPodFeatures))
	if err == nil || !strings.Contains(err.Error(), "someone-elses") || !strings.Contains(err.Error(), vmMutateWebhook) {
		t.Fatalf("err = %v, want one naming the configuration and the missing VM webhook", err)
	}
	if len(mwc.Webhooks) != 1 {
		t.Errorf("a foreign configuration was changed: %v", names(mwc))
	}
}

func find(t *testing.T, mwc *admissionregv1.MutatingWebhookConfiguration, name string) *admissionregv1.MutatingWebhook {
	t.Helper()
	for i := range mwc.Webhooks {
		if mwc.Webhooks[i].Name == name {
			return &mwc.Webhooks[i]
		}
	}
	t.Fatalf("no webhook %s in %v", name, names(mwc))
	return nil
}
