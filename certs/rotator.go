package certs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Rotator is a manager.Runnable that runs on every replica (no leader
// election: every replica must write its own cert dir).
type Rotator struct {
	client client.Client
	opts   Options
	log    logr.Logger
	// Now is the clock; tests may replace it.
	Now func() time.Time

	synced atomic.Bool
}

// New checks o and returns a Rotator. c must read from the API server, not a
// cache: the Secret and the webhook configurations are read rarely and must
// be current when deciding who won a race.
func New(c client.Client, o Options, log logr.Logger) (*Rotator, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("self-managed certificates: %w", err)
	}
	return &Rotator{client: c, opts: o, log: log, Now: time.Now}, nil
}

// NeedLeaderElection is false: every replica keeps its own cert dir current.
func (r *Rotator) NeedLeaderElection() bool { return false }

// Start runs a pass every interval until ctx ends. Errors are logged and
// counted; the next pass retries, and the certificate in use stays valid
// for at least the renew-before window.
func (r *Rotator) Start(ctx context.Context) error {
	t := time.NewTicker(r.opts.interval())
	defer t.Stop()
	r.log.Info("rotating webhook certificates", "secret", r.opts.Secret, "interval", r.opts.interval(),
		"certLifetime", r.opts.certLifetime(), "caLifetime", r.opts.caLifetime())
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := r.Reconcile(ctx); err != nil {
				r.log.Error(err, "certificate pass failed; retrying next interval")
			}
		}
	}
}

// EnsureReady runs passes until the cert dir holds a key pair (the webhook
// server cannot start without one) or ctx ends. Failing to inject the CA
// bundle does not block: the configurations may not exist yet (the chart
// creates them alongside the Deployment) and later passes inject it.
func (r *Rotator) EnsureReady(ctx context.Context) error {
	backoff := 200 * time.Millisecond
	for {
		err := r.Reconcile(ctx)
		if r.synced.Load() {
			return nil
		}
		r.log.Error(err, "no serving certificate yet; retrying", "in", backoff)
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the serving certificate in Secret %s: %w (last error: %w)", r.opts.Secret, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// ReadyCheck is a readyz check: ready once this replica has written a key
// pair from the Secret into its cert dir.
func (r *Rotator) ReadyCheck(*http.Request) error {
	if !r.synced.Load() {
		return errors.New("serving certificate not written to the cert dir yet")
	}
	return nil
}

// Reconcile is one pass: settle the Secret (secret.go), write the cert dir
// (files.go), inject the CA bundle (inject.go).
func (r *Rotator) Reconcile(ctx context.Context) error {
	st, err := r.settleSecret(ctx)
	if err != nil {
		reconcileErrors.WithLabelValues("secret").Inc()
		return err
	}
	var errs []error
	if err := r.writeFiles(st); err != nil {
		reconcileErrors.WithLabelValues("files").Inc()
		errs = append(errs, err)
	} else {
		r.synced.Store(true)
	}
	if err := r.inject(ctx, st.bundle); err != nil {
		reconcileErrors.WithLabelValues("inject").Inc()
		errs = append(errs, err)
	}
	expiry.WithLabelValues("serving").Set(float64(st.serving.Cert.NotAfter.Unix()))
	expiry.WithLabelValues("ca").Set(float64(st.signer.Cert.NotAfter.Unix()))
	return errors.Join(errs...)
}
