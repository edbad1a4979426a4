// Package metricsauth lets a request to a kvnet process's metrics endpoint
// through only when the API server says so: the bearer token is
// authenticated by a TokenReview, and the request is authorized by a
// SubjectAccessReview for its verb on its non-resource path (get
// /metrics), as kube-controller-manager and controller-runtime's metrics
// filters do, with the same cache lifetimes (a token's review for a minute,
// an allow for five, a deny for thirty seconds).
//
// kvnet has its own rather than controller-runtime's filters package
// because that one builds on k8s.io/apiserver's delegating authenticator
// and authorizer, which link CEL, gRPC, OpenTelemetry and the API server's
// option machinery into the binary: 30 of the kvnet binary's 83 MB, and
// the pages of them a running webhook touches, for two API calls and a
// cache. docs/performance.md has the figures.
package metricsauth

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// The cache lifetimes and bounds. The lifetimes are k8s.io/apiserver's
// delegating defaults, which controller-runtime's filters use: a revoked
// binding stops a scraper within five minutes, a new one lets it in within
// thirty seconds. A rejected token is remembered too, so that a client
// retrying a bad token costs the API server one review a minute. The
// bounds keep a flood of distinct tokens from growing the process: past
// them, the least recently used entry goes.
const (
	reviewTTL  = time.Minute
	allowTTL   = 5 * time.Minute
	denyTTL    = 30 * time.Second
	maxEntries = 1024
	// callTimeout bounds each review, as the delegating authenticator's
	// TokenAccessReviewTimeout does.
	callTimeout = 10 * time.Second
)

// Authorizer authenticates and authorizes requests through the API server.
// It is safe for concurrent use.
type Authorizer struct {
	tokens authnclient.TokenReviewInterface
	access authzclient.SubjectAccessReviewInterface

	// users maps a token's SHA-256 (the token itself is not kept) to its
	// review; decisions map a user and request to allowed or not.
	users     *cache.LRUExpireCache
	decisions *cache.LRUExpireCache
	// inflight makes concurrent requests with one token, or one user and
	// request, share a single review.
	inflight singleflight.Group
}

// review is what a TokenReview said of a token: who, or that it is not
// one the API server accepts.
type review struct {
	authenticated bool
	user          authnv1.UserInfo
}

// New builds an Authorizer that asks the API server at cfg, through hc.
func New(cfg *rest.Config, hc *http.Client) (*Authorizer, error) {
	tokens, err := authnclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("metrics authentication client: %w", err)
	}
	access, err := authzclient.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("metrics authorization client: %w", err)
	}
	return &Authorizer{
		tokens:    tokens.TokenReviews(),
		access:    access.SubjectAccessReviews(),
		users:     cache.NewLRUExpireCache(maxEntries),
		decisions: cache.NewLRUExpireCache(maxEntries),
	}, nil
}

// Filter has the shape of controller-runtime's metricsserver.Options
// FilterProvider: it builds an Authorizer and wraps the metrics handler
// with it.
func Filter(cfg *rest.Config, hc *http.Client) (func(logr.Logger, http.Handler) (http.Handler, error), error) {
	a, err := New(cfg, hc)
	if err != nil {
		return nil, err
	}
	return func(log logr.Logger, next http.Handler) (http.Handler, error) {
		return a.Wrap(log, next), nil
	}, nil
}

// Wrap serves next only to a request the API server authenticates and
// authorizes. A missing or rejected token is 401, a user not allowed the
// verb on the path 403; the API server failing to answer is this
// process's failure, 500, and is not remembered.
func (a *Authorizer) Wrap(log logr.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		token, ok := bearerToken(req.Header.Get("Authorization"))
		if !ok {
			http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		r, err := a.authenticate(req.Context(), token)
		if err != nil {
			log.Error(err, "Metrics request: the API server did not review the token")
			http.Error(w, "Authentication failed", http.StatusInternalServerError)
			return
		}
		if !r.authenticated {
			log.V(4).Info("Metrics request: the API server rejected the token")
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(req.Method)
		allowed, err := a.authorize(req.Context(), r.user, verb, req.URL.Path)
		if err != nil {
			log.Error(err, "Metrics request: the API server did not review access", "user", r.user.Username)
			http.Error(w, fmt.Sprintf("Authorization for user %s failed", r.user.Username), http.StatusInternalServerError)
			return
		}
		if !allowed {
			log.V(4).Info("Metrics request denied", "user", r.user.Username, "verb", verb, "path", req.URL.Path)
			http.Error(w, fmt.Sprintf("Authorization denied for user %s", r.user.Username), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, req)
	})
}

// bearerToken is the token of an "Authorization: Bearer <token>" header,
// the scheme matched without regard to case, as the API server does.
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authenticate is the API server's review of token, from the cache when it
// has one.
func (a *Authorizer) authenticate(ctx context.Context, token string) (review, error) {
	sum := sha256.Sum256([]byte(token))
	key := string(sum[:])
	if v, ok := a.users.Get(key); ok {
		return v.(review), nil
	}
	v, err, _ := a.inflight.Do("token\x00"+key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		got, err := a.tokens.Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("TokenReview: %w", err)
		}
		r := review{authenticated: got.Status.Authenticated && got.Status.Error == "", user: got.Status.User}
		a.users.Add(key, r, reviewTTL)
		return r, nil
	})
	if err != nil {
		return review{}, err
	}
	return v.(review), nil
}

// authorize is whether the API server allows user verb on the non-resource
// path, from the cache when it has the answer.
func (a *Authorizer) authorize(ctx context.Context, user authnv1.UserInfo, verb, path string) (bool, error) {
	key := decisionKey(user, verb, path)
	if v, ok := a.decisions.Get(key); ok {
		return v.(bool), nil
	}
	v, err, _ := a.inflight.Do("access\x00"+key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		extra := make(map[string]authzv1.ExtraValue, len(user.Extra))
		for k, v := range user.Extra {
			extra[k] = authzv1.ExtraValue(v)
		}
		got, err := a.access.Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:                  user.Username,
			UID:                   user.UID,
			Groups:                user.Groups,
			Extra:                 extra,
			NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb},
		}}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("SubjectAccessReview: %w", err)
		}
		if got.Status.EvaluationError != "" && !got.Status.Allowed {
			// Denied because an authorizer failed, not because the rules
			// say no: not a decision worth remembering for thirty seconds,
			// and not the client's fault.
			return nil, errors.New("SubjectAccessReview: " + got.Status.EvaluationError)
		}
		allowed := got.Status.Allowed && !got.Status.Denied
		ttl := denyTTL
		if allowed {
			ttl = allowTTL
		}
		a.decisions.Add(key, allowed, ttl)
		return allowed, nil
	})
	if err != nil {
		return false, err
	}
	return v.(bool), nil
}

// decisionKey names a user and request in the decision cache: every field
// the SubjectAccessReview is asked with, NUL-separated (no Kubernetes name
// or group holds a NUL), extra in key order.
func decisionKey(user authnv1.UserInfo, verb, path string) string {
	var b strings.Builder
	for _, s := range []string{verb, path, user.Username, user.UID} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, g := range user.Groups {
		b.WriteString(g)
		b.WriteByte(1)
	}
	b.WriteByte(0)
	keys := make([]string, 0, len(user.Extra))
	for k := range user.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(2)
		for _, v := range user.Extra[k] {
			b.WriteString(v)
			b.WriteByte(1)
		}
		b.WriteByte(0)
	}
	return b.String()
}
