package mutators

import (
	"context"
	"maps"
	"slices"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvnet/kvnet/internal/chain"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/internal/model/peers"
)

// nriConfig is network-resources-injector's configuration as its v1.9.0
// installer registers it (pods on CREATE, every namespace but kube-system),
// under name, with webhook as its webhook's name.
func nriConfig(name, webhook string) admissionregv1.MutatingWebhookConfiguration {
	return admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admissionregv1.MutatingWebhook{{
			Name: webhook,
			Rules: []admissionregv1.RuleWithOperations{{Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule: admissionregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system"}}}},
		}},
	}
}

// With network-resources-injector registered for the pod, kvnet adds no
// device resource and records that it left them to it; the node selector
// stays kvnet's. A configuration that does not call the injector for this
// pod (another webhook name, another namespace, UPDATE only, an object
// selector the pod misses) leaves the job to kvnet.
func TestNetworkResourcesLeftToInjector(t *testing.T) {
	installer := "network-resources-injector-mutating-config.k8s.cni.cncf.io"
	for name, c := range map[string]struct {
		webhooks []admissionregv1.MutatingWebhookConfiguration
		leftTo   bool
	}{
		"installer's configuration":                  {webhooks: []admissionregv1.MutatingWebhookConfiguration{nriConfig("network-resources-injector-mutating-config", installer)}, leftTo: true},
		"renamed configuration (webhook order)":      {webhooks: []admissionregv1.MutatingWebhookConfiguration{nriConfig("0-nri", installer)}, leftTo: true},
		"static deployments/webhook.yaml":            {webhooks: []admissionregv1.MutatingWebhookConfiguration{nriConfig("network-resources-injector-config", "network-resources-injector-config.k8s.io")}, leftTo: true},
		"no injector":                                {},
		"another webhook's name":                     {webhooks: []admissionregv1.MutatingWebhookConfiguration{nriConfig("x", "pods.example.com")}},
		"injector excludes the pod's namespace":      {webhooks: []admissionregv1.MutatingWebhookConfiguration{withNamespaceSelector(nriConfig("n", installer), crNS)}},
		"injector registered for UPDATE only":        {webhooks: []admissionregv1.MutatingWebhookConfiguration{updateOnly(nriConfig("n", installer))}},
		"injector's object selector misses the pod":  {webhooks: []admissionregv1.MutatingWebhookConfiguration{withObjectSelector(nriConfig("n", installer), "nri", "on")}},
		"injector's object selector matches the pod": {webhooks: []admissionregv1.MutatingWebhookConfiguration{withObjectSelector(nriConfig("n", installer), "app", "web")}, leftTo: true},
	} {
		t.Run(name, func(t *testing.T) {
			facts := nrFacts()
			facts.Webhooks = c.webhooks
			pod := nrPod{networks: `[{"name":"rack","interface":"a"},{"name":"vd","interface":"b"}]`, requests: rl("cpu", "1")}.build()
			pod.Labels = map[string]string{"app": "web"}
			req := &chain.PodRequest{Operation: admissionv1.Create, Namespace: crNS, Pod: pod, Config: &config.Config{}, Facts: facts}
			if err := (NetworkResources{}).MutatePod(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			got := rlString(pod.Spec.Containers[0].Resources.Requests)
			want := map[string]string{"cpu": "1", nrSRIOV: "1", nrVDPA: "1"}
			if c.leftTo {
				want = map[string]string{"cpu": "1"}
			}
			if !maps.Equal(got, want) {
				t.Errorf("compute requests = %v, want %v", got, want)
			}
			if pod.Spec.NodeSelector["rack"] != "r1" {
				t.Errorf("nodeSelector = %v: the node selector is kvnet's either way", pod.Spec.NodeSelector)
			}
			left := slices.ContainsFunc(req.Changes, func(ch chain.Change) bool {
				return ch.Mutator == "network-resources" && ch.LeftTo == peers.ResourceInjector &&
					slices.Equal(ch.Networks, []string{crNS + "/rack", crNS + "/vd"})
			})
			if left != c.leftTo {
				t.Errorf("changes %+v: recorded as left to %s: %v, want %v", req.Changes, peers.ResourceInjector, left, c.leftTo)
			}
		})
	}
}

func withNamespaceSelector(c admissionregv1.MutatingWebhookConfiguration, excluded string) admissionregv1.MutatingWebhookConfiguration {
	c.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values = append(c.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values, excluded)
	return c
}

func updateOnly(c admissionregv1.MutatingWebhookConfiguration) admissionregv1.MutatingWebhookConfiguration {
	c.Webhooks[0].Rules[0].Operations = []admissionregv1.OperationType{admissionregv1.Update}
	return c
}

func withObjectSelector(c admissionregv1.MutatingWebhookConfiguration, k, v string) admissionregv1.MutatingWebhookConfiguration {
	c.Webhooks[0].ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	return c
}
