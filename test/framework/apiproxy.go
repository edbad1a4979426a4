package framework

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// APIProxy stands between one kvnet replica and the API server, so a test
// can stop the replica at an exact point of its work without a hook in
// kvnet: a request it holds is the replica's next write, and killing the
// replica while a request is held is killing it right there.
//
// The replica talks plain HTTP to the proxy (Config); the proxy talks to the
// API server with the test's own credentials.
type APIProxy struct {
	// Config is the rest.Config the replica uses.
	Config *rest.Config

	srv     *http.Server
	reverse *httputil.ReverseProxy
	rt      http.RoundTripper
	target  *url.URL

	mu     sync.Mutex
	holds  []*Hold
	closed chan struct{}
	once   sync.Once
}

// Hold is one rule of the proxy: which requests it holds, and where.
type Hold struct {
	match func(*http.Request) bool
	// after: forward the request, then withhold the response; otherwise
	// withhold the request itself.
	after bool
	// Held receives "METHOD path" for each request held.
	Held chan string
}

// NewAPIProxy starts a proxy to the API server of upstream on loopback.
func NewAPIProxy(upstream *rest.Config) (*APIProxy, error) {
	target, err := url.Parse(upstream.Host)
	if err != nil {
		return nil, err
	}
	rt, err := rest.TransportFor(upstream)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &APIProxy{rt: rt, target: target, closed: make(chan struct{})}
	p.reverse = &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     rt,
		FlushInterval: -1, // watches stream
		// A replica cut off mid-watch is what the tests do; not news.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(l) }()
	p.Config = &rest.Config{Host: "http://" + l.Addr().String(), QPS: upstream.QPS, Burst: upstream.Burst}
	return p, nil
}

// HoldBefore holds every request match selects before it reaches the API
// server: the write never happens.
func (p *APIProxy) HoldBefore(match func(*http.Request) bool) *Hold {
	return p.add(&Hold{match: match, Held: make(chan string, 64)})
}

// HoldAfter forwards every request match selects and withholds the
// response: the write happened, and the replica never learns it did.
func (p *APIProxy) HoldAfter(match func(*http.Request) bool) *Hold {
	return p.add(&Hold{match: match, after: true, Held: make(chan string, 64)})
}

func (p *APIProxy) add(h *Hold) *Hold {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holds = append(p.holds, h)
	return h
}

// Close cuts the replica off: held requests are aborted, open connections
// (watches) dropped, new ones refused.
func (p *APIProxy) Close() {
	p.once.Do(func() {
		close(p.closed)
		_ = p.srv.Close()
	})
}

// ServeHTTP implements http.Handler.
func (p *APIProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var hold *Hold
	p.mu.Lock()
	for _, h := range p.holds {
		if h.match(r) {
			hold = h
			break
		}
	}
	p.mu.Unlock()
	if hold == nil {
		p.reverse.ServeHTTP(w, r)
		return
	}
	what := r.Method + " " + r.URL.Path
	if hold.after {
		resp, body, err := p.forward(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if resp.StatusCode >= 300 {
			// Refused (a conflict, say): nothing was written, so the
			// replica hears it, as it would have.
			for k, v := range resp.Header {
				w.Header()[k] = v
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(body)
			return
		}
	}
	hold.Held <- what
	select {
	case <-p.closed:
	case <-r.Context().Done():
	}
	// No answer at all, as from a process that is gone.
	panic(http.ErrAbortHandler)
}

// forward sends r to the API server and reads the whole answer.
func (p *APIProxy) forward(r *http.Request) (*http.Response, []byte, error) {
	out := r.Clone(context.WithoutCancel(r.Context()))
	out.RequestURI = ""
	out.URL.Scheme, out.URL.Host = p.target.Scheme, p.target.Host
	out.Host = p.target.Host
	resp, err := p.rt.RoundTrip(out)
	if err != nil {
		return nil, nil, fmt.Errorf("forwarding %s %s: %w", r.Method, r.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("forwarding %s %s: %w", r.Method, r.URL.Path, err)
	}
	return resp, body, nil
}
