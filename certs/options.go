package certs

import (
	"errors"
	"fmt"
	"net"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Options configure a Rotator. Zero durations take the defaults below.
type Options struct {
	// Secret holds the CA and the serving certificate.
	Secret types.NamespacedName
	// CertDir is the webhook server's cert dir; tls.crt and tls.key are
	// written there.
	CertDir string
	// DNSNames and IPAddresses the serving certificate is valid for.
	DNSNames    []string
	IPAddresses []net.IP
	// MutatingWebhooks and ValidatingWebhooks name the configurations whose
	// every webhook gets the CA bundle.
	MutatingWebhooks   []string
	ValidatingWebhooks []string
	// CALifetime (default 10 years) and CertLifetime (default 1 year).
	CALifetime   time.Duration
	CertLifetime time.Duration
	// CARenewBefore and CertRenewBefore: renew when less than this is left
	// (default a third of the lifetime).
	CARenewBefore   time.Duration
	CertRenewBefore time.Duration
	// Interval between passes (default a tenth of the shortest renew-before
	// window, at most one minute). Other replicas adopt a renewed certificate
	// within one interval, long before the old one expires.
	Interval time.Duration
}

func (o *Options) caLifetime() time.Duration {
	if o.CALifetime > 0 {
		return o.CALifetime
	}
	return 10 * 365 * 24 * time.Hour
}

func (o *Options) certLifetime() time.Duration {
	if o.CertLifetime > 0 {
		return o.CertLifetime
	}
	return 365 * 24 * time.Hour
}

func (o *Options) caRenewBefore() time.Duration {
	if o.CARenewBefore > 0 {
		return o.CARenewBefore
	}
	return o.caLifetime() / 3
}

func (o *Options) certRenewBefore() time.Duration {
	if o.CertRenewBefore > 0 {
		return o.CertRenewBefore
	}
	return o.certLifetime() / 3
}

func (o *Options) interval() time.Duration {
	if o.Interval > 0 {
		return o.Interval
	}
	return min(time.Minute, o.certRenewBefore()/10, o.caRenewBefore()/10)
}

// Validate reports options that cannot work, before anything is created.
func (o *Options) Validate() error {
	var errs []error
	if o.Secret.Name == "" || o.Secret.Namespace == "" {
		errs = append(errs, errors.New("the Secret's name and namespace are required"))
	}
	if o.CertDir == "" {
		errs = append(errs, errors.New("the cert dir is required"))
	}
	if len(o.DNSNames) == 0 && len(o.IPAddresses) == 0 {
		errs = append(errs, errors.New("at least one DNS name or IP address is required"))
	}
	if o.certRenewBefore() >= o.certLifetime() {
		errs = append(errs, fmt.Errorf("certificate renew-before %s must be shorter than its lifetime %s", o.certRenewBefore(), o.certLifetime()))
	}
	if o.caRenewBefore() >= o.caLifetime() {
		errs = append(errs, fmt.Errorf("CA renew-before %s must be shorter than its lifetime %s", o.caRenewBefore(), o.caLifetime()))
	}
	if o.certLifetime() > o.caLifetime() {
		errs = append(errs, fmt.Errorf("certificate lifetime %s must not exceed the CA lifetime %s", o.certLifetime(), o.caLifetime()))
	}
	return errors.Join(errs...)
}
