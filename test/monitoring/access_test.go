package monitoring

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/kvnet/kvnet/test/framework"
)

// The scrapers' namespace: Prometheus' ServiceAccount, bound to the chart's
// metrics-reader ClusterRole through metrics.reader.subjects, and one with
// no binding.
const (
	scrapers     = "mon-prometheus"
	prometheusSA = "prometheus"
	strangerSA   = "stranger"
)

// readerToken is a token of the Prometheus ServiceAccount, bound to the
// metrics-reader ClusterRole by the chart's own objects (rendered for
// release kvnet and applied here, once per run).
func readerToken(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	out := helm(t, fmt.Sprintf("metrics: {reader: {subjects: [{kind: ServiceAccount, name: %s, namespace: %s}]}}\n", prometheusSA, scrapers),
		"template", "kvnet", "--namespace", framework.KvnetNamespace, "--show-only", "templates/metrics-reader.yaml")
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	kinds := map[string]bool{}
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if len(u.Object) == 0 {
			continue
		}
		kinds[u.GetKind()] = true
		if err := env.Client.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating the chart's %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	if !kinds["ClusterRole"] || !kinds["ClusterRoleBinding"] {
		t.Fatalf("templates/metrics-reader.yaml rendered %v, want a ClusterRole and its binding", kinds)
	}
	return saToken(t, prometheusSA)
}

// saToken is a token of ServiceAccount name in the scrapers' namespace.
func saToken(t *testing.T, name string) string {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: scrapers}}
	if err := env.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	token, err := framework.ServiceAccountToken(ctx, env.Client, scrapers, name)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// metricsTLS verifies kvnet's metrics certificate as Prometheus does.
func metricsTLS(t *testing.T) *tls.Config {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(env.MetricsCA) {
		t.Fatal("the framework gave no metrics CA")
	}
	return &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

// kvnet's /metrics answers only HTTPS, and only a bearer token the API
// server authenticates and allows get on /metrics: no token is 401, a
// ServiceAccount without the chart's metrics-reader ClusterRole 403, one
// bound to it gets the series. Plain HTTP never gets them.
func TestMetricsAreServedOnlyToReaders(t *testing.T) {
	reader, stranger := readerToken(t), saToken(t, strangerSA)

	code, body, err := framework.ScrapePlain(metricsAddr)
	if err != nil || code != http.StatusBadRequest || strings.Contains(body, "kvnet_") {
		t.Errorf("plain HTTP: %d, %v, %.200q; want TLS's 400 and no series", code, err, body)
	}
	for _, tc := range []struct {
		who   string
		token string
		want  []int
	}{
		{"no token", "", []int{http.StatusUnauthorized}},
		{"a token the API server rejects", "not-a-token", []int{http.StatusUnauthorized}},
		{"a ServiceAccount without the metrics-reader role", stranger, []int{http.StatusForbidden}},
		{"a ServiceAccount bound to the metrics-reader role", reader, []int{http.StatusOK}},
	} {
		code, body, err := framework.Scrape(metricsAddr, metricsTLS(t), tc.token)
		if err != nil {
			t.Fatalf("%s: %v", tc.who, err)
		}
		if !slices.Contains(tc.want, code) {
			t.Errorf("%s: %d, want %v: %.200s", tc.who, code, tc.want, body)
		}
		ok := tc.want[0] == http.StatusOK
		if got := strings.Contains(body, "kvnet_config_last_reload_successful"); got != ok {
			t.Errorf("%s: series in the answer = %v, want %v", tc.who, got, ok)
		}
	}
}
