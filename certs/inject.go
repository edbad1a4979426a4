package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// trusted reports whether every webhook of every configured configuration
// already carries ca in its CA bundle. A missing configuration counts as not
// trusting: promoting then could break it the moment it is created with an
// old bundle copied from somewhere.
func (r *Rotator) trusted(ctx context.Context, ca *x509.Certificate) (bool, error) {
	ok := true
	err := r.eachConfig(ctx, func(bundles []*[]byte) bool {
		for _, b := range bundles {
			ok = ok && BundleContains(*b, ca)
		}
		return false
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return ok, err
}

// inject writes bundle into every webhook of the configured configurations.
func (r *Rotator) inject(ctx context.Context, bundle []byte) error {
	return r.eachConfig(ctx, func(bundles []*[]byte) bool {
		changed := false
		for _, b := range bundles {
			if !bytes.Equal(*b, bundle) {
				*b = bundle
				changed = true
			}
		}
		return changed
	})
}

// eachConfig reads each configuration, lets fn look at (and change) its
// webhooks' CA bundles and updates it when fn reports a change. The first
// error stops it; a Conflict is retried on the next pass.
func (r *Rotator) eachConfig(ctx context.Context, fn func(bundles []*[]byte) bool) error {
	for _, name := range r.opts.MutatingWebhooks {
		var c admissionregv1.MutatingWebhookConfiguration
		if err := r.client.Get(ctx, client.ObjectKey{Name: name}, &c); err != nil {
			return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", name, err)
		}
		var bs []*[]byte
		for i := range c.Webhooks {
			bs = append(bs, &c.Webhooks[i].ClientConfig.CABundle)
		}
		if err := r.updateIf(ctx, fn(bs), &c); err != nil {
			return err
		}
	}
	for _, name := range r.opts.ValidatingWebhooks {
		var c admissionregv1.ValidatingWebhookConfiguration
		if err := r.client.Get(ctx, client.ObjectKey{Name: name}, &c); err != nil {
			return fmt.Errorf("reading ValidatingWebhookConfiguration %s: %w", name, err)
		}
		var bs []*[]byte
		for i := range c.Webhooks {
			bs = append(bs, &c.Webhooks[i].ClientConfig.CABundle)
		}
		if err := r.updateIf(ctx, fn(bs), &c); err != nil {
			return err
		}
	}
	return nil
}

func (r *Rotator) updateIf(ctx context.Context, changed bool, obj client.Object) error {
	if !changed {
		return nil
	}
	if err := r.client.Update(ctx, obj); err != nil {
		return fmt.Errorf("injecting the CA bundle into %T %s: %w", obj, obj.GetName(), err)
	}
	injections.Inc()
	r.log.Info("injected the CA bundle", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName())
	return nil
}
