package test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvnet/kvnet/internal/metricsauth"
	"github.com/kvnet/kvnet/test/framework"
)

// reviewCounter counts the API server's TokenReviews and
// SubjectAccessReviews an Authorizer makes.
type reviewCounter struct {
	next          http.RoundTripper
	tokens, audit atomic.Int64
}

func (c *reviewCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case strings.HasSuffix(req.URL.Path, "/tokenreviews"):
		c.tokens.Add(1)
	case strings.HasSuffix(req.URL.Path, "/subjectaccessreviews"):
		c.audit.Add(1)
	}
	return c.next.RoundTrip(req)
}

// metricsAuthorizer is an Authorizer asking the test API server as cfg,
// its reviews counted, around a handler that answers "series".
func metricsAuthorizer(t *testing.T, cfg *rest.Config) (http.Handler, *reviewCounter) {
	t.Helper()
	cfg = rest.CopyConfig(cfg)
	counter := &reviewCounter{}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter })
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, err := metricsauth.New(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	series := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("series")) })
	return a.Wrap(logr.Discard(), series), counter
}

// metricsReader makes a ServiceAccount in ns allowed get on /metrics (and
// nothing else) and one with no rights, and returns their tokens.
func metricsReader(t *testing.T, ns string) (reader, stranger string) {
	t.Helper()
	ctx := t.Context()
	var err error
	if reader, err = framework.ServiceAccountToken(ctx, env.Client, ns, "prometheus"); err != nil {
		t.Fatal(err)
	}
	if stranger, err = framework.ServiceAccountToken(ctx, env.Client, ns, "stranger"); err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "prometheus", Namespace: ns}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, o) })
	}
	// The API server's authorizer sees a new binding through its own
	// informers: wait until it allows the reader, or the first review may
	// be a denial, which the gate rightly remembers.
	framework.Eventually(t, "the API server allows the reader /metrics", 30*time.Second, func() error {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:                  "system:serviceaccount:" + ns + ":prometheus",
			Groups:                []string{"system:serviceaccounts", "system:serviceaccounts:" + ns},
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"},
		}}
		if err := env.Client.Create(ctx, sar); err != nil {
			return err
		}
		if !sar.Status.Allowed {
			return fmt.Errorf("not allowed yet: %s", sar.Status.Reason)
		}
		return nil
	})
	return reader, stranger
}

func scrapeThrough(h http.Handler, method, path, authorization string) (int, string) {
	req := httptest.NewRequest(method, path, nil)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// The metrics endpoint's gate asks the API server: only a token it
// authenticates, of a user it allows the request's verb on the request's
// path, gets through. A missing, malformed or rejected token is 401; the
// right user asking another verb or path is 403, as is a user with no
// rights.
func TestMetricsAuthorizerAsksTheAPIServer(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	reader, stranger := metricsReader(t, ns)
	h, _ := metricsAuthorizer(t, env.Config)
	for _, tc := range []struct {
		who, method, path, authorization string
		want                             int
	}{
		{"no Authorization header", "GET", "/metrics", "", http.StatusUnauthorized},
		{"basic credentials", "GET", "/metrics", "Basic cHJvbWV0aGV1czpzZWNyZXQ=", http.StatusUnauthorized},
		{"an empty bearer token", "GET", "/metrics", "Bearer  ", http.StatusUnauthorized},
		{"a token the API server rejects", "GET", "/metrics", "Bearer not-a-token", http.StatusUnauthorized},
		{"a ServiceAccount with no rights", "GET", "/metrics", "Bearer " + stranger, http.StatusForbidden},
		{"the reader, posting", "POST", "/metrics", "Bearer " + reader, http.StatusForbidden},
		{"the reader, on another path", "GET", "/debug/pprof/heap", "Bearer " + reader, http.StatusForbidden},
		{"the reader", "GET", "/metrics", "Bearer " + reader, http.StatusOK},
		{"the reader, the scheme in lower case", "GET", "/metrics", "bearer " + reader, http.StatusOK},
	} {
		code, body := scrapeThrough(h, tc.method, tc.path, tc.authorization)
		if code != tc.want {
			t.Errorf("%s: %d %q, want %d", tc.who, code, body, tc.want)
		}
		if got := body == "series"; got != (tc.want == http.StatusOK) {
			t.Errorf("%s: served the handler = %v, want %v", tc.who, got, tc.want == http.StatusOK)
		}
	}
}

// A scraper every few seconds costs the API server one review of each kind
// per cache lifetime, not one per scrape, and so does a client retrying a
// rejected token; concurrent first requests share one review.
func TestMetricsAuthorizerRemembersReviews(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	reader, stranger := metricsReader(t, ns)
	h, counter := metricsAuthorizer(t, env.Config)

	var wg sync.WaitGroup
	codes := make([]int, 16)
	for i := range codes {
		wg.Go(func() { codes[i], _ = scrapeThrough(h, "GET", "/metrics", "Bearer "+reader) })
	}
	wg.Wait()
	for range 20 {
		code, _ := scrapeThrough(h, "GET", "/metrics", "Bearer "+reader)
		codes = append(codes, code)
	}
	for i, c := range codes {
		if c != http.StatusOK {
			t.Fatalf("scrape %d: %d, want 200", i, c)
		}
	}
	if tr, sar := counter.tokens.Load(), counter.audit.Load(); tr != 1 || sar != 1 {
		t.Errorf("36 scrapes by one reader made %d TokenReviews and %d SubjectAccessReviews, want 1 and 1", tr, sar)
	}

	for range 10 {
		scrapeThrough(h, "GET", "/metrics", "Bearer not-a-token")
		scrapeThrough(h, "GET", "/metrics", "Bearer "+stranger)
	}
	if tr, sar := counter.tokens.Load(), counter.audit.Load(); tr != 3 || sar != 2 {
		t.Errorf("10 retries of a rejected token and of a denied user brought the reviews to %d and %d, want 3 and 2", tr, sar)
	}
}

// When the API server cannot review (here: the process's own identity may
// not create TokenReviews), a scrape is this process's failure, 500, not
// the scraper's 401, and is asked again on the next scrape rather than
// remembered.
func TestMetricsAuthorizerFailsAsItsOwnFault(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	reader, _ := metricsReader(t, ns)
	unprivileged, err := framework.ServiceAccountToken(t.Context(), env.Client, ns, "kvnet-without-rbac")
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = unprivileged
	h, counter := metricsAuthorizer(t, cfg)
	for i := range 2 {
		code, body := scrapeThrough(h, "GET", "/metrics", "Bearer "+reader)
		if code != http.StatusInternalServerError || body == "series" {
			t.Errorf("scrape %d with no right to review: %d %q, want 500", i, code, body)
		}
	}
	if n := counter.tokens.Load(); n != 2 {
		t.Errorf("two scrapes made %d TokenReview attempts, want 2 (a failure is not remembered)", n)
	}
}
