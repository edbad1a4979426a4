package app

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/kvnet/kvnet/certs"
)

// Certificate modes of `kvnet webhook`.
const (
	// CertModeExternal: something else (cert-manager, a mounted Secret)
	// puts tls.crt and tls.key into --cert-dir and the CA bundle into the
	// webhook configurations.
	CertModeExternal = "external"
	// CertModeSelfManaged: kvnet creates and rotates them itself (package certs).
	CertModeSelfManaged = "self-managed"
)

// CertFlags are the certificate settings of `kvnet webhook`.
type CertFlags struct {
	Mode            string
	Secret          string
	ConfigNames     []string
	ServiceName     string
	ClusterDomain   string
	ExtraSANs       []string
	CALifetime      time.Duration
	CertLifetime    time.Duration
	CARenewBefore   time.Duration
	CertRenewBefore time.Duration
	Interval        time.Duration
	// Now is the rotator's clock, nil for the real one. No flag sets it:
	// tests run it ahead to drive renewals and CA rotations in seconds
	// while the certificates stay valid, in real time, for hours.
	Now func() time.Time
}

func (f *CertFlags) register(c *cobra.Command) {
	fs := c.Flags()
	fs.StringVar(&f.Mode, "cert-mode", CertModeExternal, "external (tls.crt/tls.key in --cert-dir come from cert-manager or a mounted Secret) or self-managed (kvnet creates, injects and rotates them)")
	fs.StringVar(&f.Secret, "cert-secret", "kvnet-webhook-cert", "self-managed: Secret holding the CA and serving certificate, \"name\" (in --namespace) or \"namespace/name\"")
	fs.StringSliceVar(&f.ConfigNames, "webhook-config-name", []string{"kvnet"}, "self-managed: Mutating- and ValidatingWebhookConfigurations that get the CA bundle (repeatable)")
	fs.StringVar(&f.ServiceName, "cert-service-name", "kvnet", "self-managed: webhook Service; the certificate covers <svc>, <svc>.<ns>, <svc>.<ns>.svc and <svc>.<ns>.svc.<cluster-domain>")
	fs.StringVar(&f.ClusterDomain, "cert-cluster-domain", "cluster.local", "self-managed: cluster DNS domain")
	fs.StringSliceVar(&f.ExtraSANs, "cert-extra-sans", nil, "self-managed: more DNS names or IP addresses for the certificate (for example 127.0.0.1 when the API server calls a URL)")
	fs.DurationVar(&f.CALifetime, "cert-ca-lifetime", 10*365*24*time.Hour, "self-managed: CA lifetime")
	fs.DurationVar(&f.CertLifetime, "cert-lifetime", 365*24*time.Hour, "self-managed: serving certificate lifetime")
	fs.DurationVar(&f.CARenewBefore, "cert-ca-renew-before", 0, "self-managed: rotate the CA when less than this is left (default a third of its lifetime)")
	fs.DurationVar(&f.CertRenewBefore, "cert-renew-before", 0, "self-managed: renew the serving certificate when less than this is left (default a third of its lifetime)")
	fs.DurationVar(&f.Interval, "cert-check-interval", 0, "self-managed: time between checks of the Secret (default a tenth of the shortest renew window, at most 1m)")
}

// Options turns the flags into the certs package's options.
func (f CertFlags) Options(namespace, certDir string) (certs.Options, error) {
	if namespace == "" {
		return certs.Options{}, fmt.Errorf("--cert-mode=%s needs --namespace (or POD_NAMESPACE) for the Secret and the Service name", CertModeSelfManaged)
	}
	secret := types.NamespacedName{Namespace: namespace, Name: f.Secret}
	if ns, name, ok := strings.Cut(f.Secret, "/"); ok {
		secret = types.NamespacedName{Namespace: ns, Name: name}
	}
	o := certs.Options{
		Secret: secret, CertDir: certDir,
		MutatingWebhooks: f.ConfigNames, ValidatingWebhooks: f.ConfigNames,
		CALifetime: f.CALifetime, CertLifetime: f.CertLifetime,
		CARenewBefore: f.CARenewBefore, CertRenewBefore: f.CertRenewBefore, Interval: f.Interval,
	}
	if f.ServiceName != "" {
		svc := f.ServiceName
		o.DNSNames = []string{svc, svc + "." + namespace, svc + "." + namespace + ".svc"}
		if f.ClusterDomain != "" {
			o.DNSNames = append(o.DNSNames, svc+"."+namespace+".svc."+f.ClusterDomain)
		}
	}
	for _, san := range f.ExtraSANs {
		if ip := net.ParseIP(san); ip != nil {
			o.IPAddresses = append(o.IPAddresses, ip)
		} else if san != "" {
			o.DNSNames = append(o.DNSNames, san)
		}
	}
	return o, o.Validate()
}

// SetUpCerts starts self-managed certificates on mgr: the first key pair is
// in the cert dir when it returns (the webhook server needs it to start),
// later renewals run with the manager on every replica, and readiness waits
// for the key pair.
func SetUpCerts(ctx context.Context, mgr manager.Manager, f CertFlags, so *ServeOptions) error {
	switch f.Mode {
	case "", CertModeExternal:
		return nil
	case CertModeSelfManaged:
	default:
		return fmt.Errorf("--cert-mode: want %s or %s, got %q", CertModeExternal, CertModeSelfManaged, f.Mode)
	}
	o, err := f.Options(so.Namespace, so.CertDir)
	if err != nil {
		return fmt.Errorf("self-managed certificates: %w", err)
	}
	// A direct client: the manager's cache has not started yet, and the
	// Secret and the webhook configurations are read rarely.
	c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	r, err := certs.New(c, o, ctrl.Log.WithName("certs"))
	if err != nil {
		return err
	}
	if f.Now != nil {
		r.Now = f.Now
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := r.EnsureReady(ctx); err != nil {
		return err
	}
	if err := mgr.Add(r); err != nil {
		return err
	}
	return mgr.AddReadyzCheck("serving-cert", r.ReadyCheck)
}
