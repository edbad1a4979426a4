// Package peerwebhook calls another component's mutating admission webhook
// the way the API server does: an AdmissionReview POSTed to the address its
// MutatingWebhookConfiguration registers (a URL, or a Service as
// <name>.<namespace>.svc), trusting the caBundle registered with it.
//
// kvnet does this in one place only: where a peer that must see what kvnet
// adds to an object (kubemacpool, which gives interfaces their MACs) is
// called by the API server before kvnet and never again, so kvnet asks it
// itself (see mutators.MACPool). It is not on the common admission path:
// a cluster without such a peer, or with it ordered after kvnet, never
// dials anything.
package peerwebhook

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultTimeout is the API server's default webhook timeout, used where
// a webhook registers none.
const DefaultTimeout = 10 * time.Second

// maxAnswer bounds the answer read from a peer: an AdmissionReview whose
// patch sets a few MACs is a few KB; the API server's own limit on a
// request body (3 MiB) is far more than any answer needs.
const maxAnswer = 3 << 20

// maxClients bounds the HTTP clients kept (one per address and CA bundle):
// a cluster has a handful of webhooks; a bundle rotated leaves its old
// client behind, dropped when the bound is reached.
const maxClients = 16

// Client calls peers' webhooks. Its connections are kept between calls. The
// zero Client is ready to use and safe for concurrent use.
type Client struct {
	// MaxTimeout caps a call's wait below the webhook's own
	// timeoutSeconds (0: no cap). The caller is a webhook with a timeout
	// of its own: a peer that takes all of its time must leave kvnet
	// enough to answer, or the API server fails kvnet instead, whatever
	// the peer's failurePolicy says.
	MaxTimeout time.Duration

	mu      sync.Mutex
	clients map[clientKey]*http.Client
}

type clientKey struct {
	serverName string
	caBundle   [sha256.Size]byte
}

// Call sends req to the webhook hook registers, waiting at most hook's
// timeoutSeconds (DefaultTimeout without one), MaxTimeout, and never past
// ctx's deadline. It returns the webhook's answer, its UID checked against
// req's; an error says why there is none (the address, the connection,
// the status, the body), naming the webhook.
func (c *Client) Call(ctx context.Context, hook *admissionregv1.MutatingWebhook, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	resp, err := c.call(ctx, hook, req)
	if err != nil {
		return nil, fmt.Errorf("calling webhook %s: %w", hook.Name, err)
	}
	return resp, nil
}

func (c *Client) call(ctx context.Context, hook *admissionregv1.MutatingWebhook, req *admissionv1.AdmissionRequest) (*admissionv1.AdmissionResponse, error) {
	address, serverName, err := Address(hook.ClientConfig)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout(hook))
	defer cancel()

	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: reviewType,
		Request:  req,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the AdmissionReview: %w", err)
	}
	hc, err := c.client(serverName, hook.ClientConfig.CABundle)
	if err != nil {
		return nil, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, address, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/json")
	hresp, err := hc.Do(hreq)
	if err != nil {
		return nil, err
	}
	defer hresp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(hresp.Body, maxAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("reading the answer: %w", err)
	}
	if len(answer) > maxAnswer {
		return nil, fmt.Errorf("the answer is larger than %d bytes", maxAnswer)
	}
	if hresp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", hresp.StatusCode, bytes.TrimSpace(answer[:min(len(answer), 200)]))
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(answer, &review); err != nil {
		return nil, fmt.Errorf("decoding the AdmissionReview it answered: %w", err)
	}
	switch {
	case review.APIVersion != reviewType.APIVersion || review.Kind != reviewType.Kind:
		return nil, fmt.Errorf("it answered %s %s, want %s %s", review.APIVersion, review.Kind, reviewType.APIVersion, reviewType.Kind)
	case review.Response == nil:
		return nil, errors.New("its AdmissionReview has no response")
	case review.Response.UID != req.UID:
		return nil, fmt.Errorf("it answered uid %q to request %q", review.Response.UID, req.UID)
	}
	return review.Response, nil
}

// Timeout is how long a call of hook waits: its timeoutSeconds
// (DefaultTimeout without one), at most MaxTimeout.
func (c *Client) Timeout(hook *admissionregv1.MutatingWebhook) time.Duration {
	timeout := DefaultTimeout
	if hook.TimeoutSeconds != nil && *hook.TimeoutSeconds > 0 {
		timeout = time.Duration(*hook.TimeoutSeconds) * time.Second
	}
	if c.MaxTimeout > 0 {
		timeout = min(timeout, c.MaxTimeout)
	}
	return timeout
}

// reviewType is an AdmissionReview's TypeMeta, as the API server sends it
// and a webhook answers it.
var reviewType = metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"}

// Address is where the API server sends a webhook's reviews: its URL, or
// https://<name>.<namespace>.svc:<port><path> for a Service (port 443 and
// path "/" by default), and the TLS server name it checks the serving
// certificate against.
func Address(cc admissionregv1.WebhookClientConfig) (address, serverName string, err error) {
	switch {
	case cc.URL != nil:
		u, err := url.Parse(*cc.URL)
		if err != nil {
			return "", "", fmt.Errorf("clientConfig.url: %w", err)
		}
		if u.Scheme != "https" || u.Host == "" {
			return "", "", fmt.Errorf("clientConfig.url %q: want an https URL with a host", *cc.URL)
		}
		return u.String(), u.Hostname(), nil
	case cc.Service != nil:
		s := cc.Service
		if s.Name == "" || s.Namespace == "" {
			return "", "", errors.New("clientConfig.service: want a name and a namespace")
		}
		host := s.Name + "." + s.Namespace + ".svc"
		port := int32(443)
		if s.Port != nil {
			port = *s.Port
		}
		path := "/"
		if s.Path != nil {
			path = *s.Path
		}
		u := url.URL{Scheme: "https", Host: host + ":" + strconv.Itoa(int(port)), Path: path}
		return u.String(), host, nil
	}
	return "", "", errors.New("clientConfig: neither url nor service is set")
}

// client returns the HTTP client for a server name and CA bundle, made
// once and kept (connections are reused across calls).
func (c *Client) client(serverName string, caBundle []byte) (*http.Client, error) {
	key := clientKey{serverName: serverName, caBundle: sha256.Sum256(caBundle)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc, ok := c.clients[key]; ok {
		return hc, nil
	}
	tc := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if len(caBundle) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caBundle) {
			return nil, errors.New("clientConfig.caBundle holds no PEM certificate")
		}
		tc.RootCAs = pool
	}
	if c.clients == nil || len(c.clients) >= maxClients {
		for _, old := range c.clients {
			old.CloseIdleConnections()
		}
		c.clients = map[clientKey]*http.Client{}
	}
	hc := &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:     tc,
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 4,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
		},
		// A webhook answers; it does not redirect (the API server
		// follows none either).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	c.clients[key] = hc
	return hc, nil
}
