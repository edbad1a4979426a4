package test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/kvnet/kvnet/certs"
	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/test/framework"
)

// errKilled is what a killed replica's last call returns: nothing, as far
// as the cluster can tell.
var errKilled = errors.New("replica killed")

// killedAt returns a client on the API server that kills the replica
// (cancels ctx) at the first write kill selects: before it is sent
// (after=false) or once the API server has stored it (after=true), the
// answer then lost with the process. Every other call goes through.
func killedAt(t *testing.T, cancel context.CancelFunc, kill func(client.Object) bool, after bool) client.Client {
	t.Helper()
	c, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	dead := false
	return interceptor.NewClient(c, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if dead {
				return errKilled
			}
			if !kill(obj) {
				return c.Update(ctx, obj, opts...)
			}
			if after {
				if err := c.Update(ctx, obj, opts...); err != nil {
					return err
				}
			}
			dead = true
			cancel()
			return errKilled
		},
	})
}

// A CA rotation takes two passes of the certificate Secret (stage the new
// CA in the bundle, then, once every webhook configuration trusts it,
// promote it) with the bundle injection between them. A replica is killed
// at both seams: right after it staged the CA, before it injected the
// bundle; and right after it promoted the CA, before it injected or wrote
// its cert dir. Each time the surviving replica's passes finish the work
// the victim started (the CA the victim staged is the one that ends up
// signing), and the result is consistent: no CA staged and left behind,
// every webhook's bundle equal to the Secret's, and the survivor serving a
// certificate the API server's bundle verifies.
func TestCertRotationReplicaKilledMidway(t *testing.T) {
	ns := env.NewNamespace(t, nil)
	ctx := t.Context()
	name := "kvnet-faults-" + ns
	// Webhooks selecting no namespace: only their CA bundles matter here.
	registerURLWebhooks(t, name, "127.0.0.1:9", map[string]string{"kvnet.io/faults-certs": "none"})
	flags := app.CertFlags{
		Mode: app.CertModeSelfManaged, Secret: "kvnet-webhook-cert", ConfigNames: []string{name}, ServiceName: "kvnet",
		CALifetime: 30 * 24 * time.Hour, CARenewBefore: 10 * 24 * time.Hour,
		CertLifetime: 3 * 24 * time.Hour, CertRenewBefore: 24 * time.Hour,
	}
	rotator := func(c client.Client, now time.Time) (*certs.Rotator, string) {
		dir := t.TempDir()
		o, err := flags.Options(ns, dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := certs.New(c, o, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		r.Now = func() time.Time { return now }
		return r, dir
	}
	secretKey := types.NamespacedName{Namespace: ns, Name: flags.Secret}
	secret := func() *corev1.Secret {
		var s corev1.Secret
		if err := env.Client.Get(ctx, secretKey, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}

	survivor, survivorDir := rotator(env.Client, time.Now())
	if err := survivor.EnsureReady(ctx); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, "the first CA injected", 30*time.Second, func() error { return bundlesEqual(ctx, name, secret().Data[certs.KeyCABundle]) })

	// Twenty-one days on, the CA has less than its renew-before window left.
	later := time.Now().Add(21 * 24 * time.Hour)
	survivor.Now = func() time.Time { return later }

	// Victim 1 stages the new CA in the Secret and is killed before it
	// injects the bundle.
	vctx, kill := context.WithCancel(ctx)
	isConfig := func(o client.Object) bool { _, ok := o.(*admissionregv1.MutatingWebhookConfiguration); return ok }
	victim, _ := rotator(killedAt(t, kill, isConfig, false), later)
	if err := victim.Reconcile(vctx); !errors.Is(err, errKilled) {
		t.Fatalf("victim 1 was not killed at the bundle injection: %v", err)
	}
	staged, err := certs.ParseKeyPair(secret().Data[certs.KeyNextCert], secret().Data[certs.KeyNextKey])
	if err != nil {
		t.Fatalf("victim 1 should have staged a CA before it died: %v", err)
	}
	if err := bundlesEqual(ctx, name, secret().Data[certs.KeyCABundle]); err == nil {
		t.Fatal("the webhook configurations already carry the staged CA: victim 1 died too late to test anything")
	}

	// The survivor's next pass injects the staged CA.
	if err := survivor.Reconcile(ctx); err != nil {
		t.Fatalf("survivor after victim 1: %v", err)
	}
	if err := bundlesEqual(ctx, name, secret().Data[certs.KeyCABundle]); err != nil {
		t.Fatalf("the survivor did not inject the CA victim 1 staged: %v", err)
	}

	// Victim 2 promotes the staged CA (the configurations trust it now);
	// the write lands and it dies before anything else.
	vctx, kill = context.WithCancel(ctx)
	isPromotion := func(o client.Object) bool {
		s, ok := o.(*corev1.Secret)
		return ok && len(s.Data[certs.KeyNextCert]) == 0
	}
	victim, victimDir := rotator(killedAt(t, kill, isPromotion, true), later)
	if err := victim.Reconcile(vctx); !errors.Is(err, errKilled) {
		t.Fatalf("victim 2 was not killed at the promotion: %v", err)
	}
	if _, err := os.Stat(filepath.Join(victimDir, certs.KeyTLSCert)); err == nil {
		t.Fatal("victim 2 wrote its cert dir: it died too late to test anything")
	}

	// The survivor's passes settle everything.
	framework.Eventually(t, "the survivor finished the rotation consistently", 30*time.Second, func() error {
		if err := survivor.Reconcile(ctx); err != nil {
			return err
		}
		s := secret()
		if len(s.Data[certs.KeyNextCert]) > 0 {
			return errors.New("a CA is still staged")
		}
		signer, err := certs.ParseKeyPair(s.Data[certs.KeyCACert], s.Data[certs.KeyCAKey])
		if err != nil {
			return err
		}
		if !signer.Cert.Equal(staged.Cert) {
			return errors.New("the Secret signs with another CA than the one victim 1 staged")
		}
		if err := bundlesEqual(ctx, name, s.Data[certs.KeyCABundle]); err != nil {
			return err
		}
		served, err := os.ReadFile(filepath.Join(survivorDir, certs.KeyTLSCert))
		if err != nil {
			return err
		}
		if !bytes.Equal(served, s.Data[certs.KeyTLSCert]) {
			return errors.New("the survivor's cert dir does not hold the Secret's serving certificate")
		}
		return verifiedByWebhookBundle(ctx, name, served, "kvnet."+ns+".svc", later)
	})
}

// verifiedByWebhookBundle checks that the API server, holding the bundle of
// configuration name, would accept the serving certificate at now.
func verifiedByWebhookBundle(ctx context.Context, name string, certPEM []byte, dnsName string, now time.Time) error {
	var m admissionregv1.MutatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: name}, &m); err != nil {
		return err
	}
	leaf, err := certs.ParseCerts(certPEM)
	if err != nil || len(leaf) == 0 {
		return fmt.Errorf("serving certificate: %v", err)
	}
	for _, w := range m.Webhooks {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(w.ClientConfig.CABundle) {
			return fmt.Errorf("webhook %s: no CA in its bundle", w.Name)
		}
		if _, err := leaf[0].Verify(x509.VerifyOptions{Roots: pool, DNSName: dnsName, CurrentTime: now}); err != nil {
			return fmt.Errorf("webhook %s would refuse the survivor's certificate: %w", w.Name, err)
		}
	}
	return nil
}
