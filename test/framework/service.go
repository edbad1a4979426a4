package framework

import (
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Service stands for the kvnet Service in front of several replicas: a TCP
// forwarder on loopback that sends each new connection to the next of its
// endpoints, round robin. The API server calls it by URL; TLS passes
// through, so the API server verifies the replica's own certificate. A test
// changes the endpoints as the endpoints controller would when a pod goes.
type Service struct {
	// Addr is host:port for the webhook configurations' URLs.
	Addr string

	l         net.Listener
	mu        sync.Mutex
	endpoints []string
	next      atomic.Uint64
	wg        sync.WaitGroup
	links     map[*link]struct{}
}

// link is one forwarded connection: in from the client, out to its
// endpoint (nil until dialled).
type link struct {
	in, out  net.Conn
	to       string
	departed bool          // its endpoint left; guarded by Service.mu
	done     chan struct{} // closed once both directions have ended
}

// NewService listens on 127.0.0.1 and forwards to endpoints.
func NewService(endpoints ...string) (*Service, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Service{Addr: l.Addr().String(), l: l, endpoints: endpoints, links: map[*link]struct{}{}}
	s.wg.Go(s.accept)
	return s, nil
}

// drainWait bounds how long SetEndpoints waits for a client to close a
// connection whose endpoint left.
const drainWait = 10 * time.Second

// SetEndpoints replaces the endpoints and ends the connections to the ones
// that left, so the next call goes to the new set: the API server keeps
// its connections to a webhook alive between calls. It returns once the
// clients have closed those connections (or drainWait passed): the side
// to the endpoint is closed, the client gets end of file, and an idle
// keep-alive connection leaves the API server's pool before its next
// call. Closing the client's side outright would race that call: a
// request written on a connection closed a moment before fails (broken
// pipe) instead of opening a new connection.
func (s *Service) SetEndpoints(endpoints ...string) {
	s.mu.Lock()
	s.endpoints = endpoints
	var gone []*link
	for l := range s.links {
		if !slices.Contains(endpoints, l.to) {
			l.departed = true
			if l.out != nil {
				_ = l.out.Close()
			} else if tc, ok := l.in.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			gone = append(gone, l)
		}
	}
	s.mu.Unlock()
	deadline := time.NewTimer(drainWait)
	defer deadline.Stop()
	for _, l := range gone {
		select {
		case <-l.done:
		case <-deadline.C:
			_ = l.in.Close()
			<-l.done
		}
	}
}

// Close stops accepting, drops every forwarded connection and waits for
// the forwarding goroutines.
func (s *Service) Close() {
	_ = s.l.Close()
	s.mu.Lock()
	for l := range s.links {
		_ = l.in.Close()
		if l.out != nil {
			_ = l.out.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *Service) accept() {
	for {
		in, err := s.l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		l := &link{in: in, done: make(chan struct{})}
		if len(s.endpoints) > 0 {
			l.to = s.endpoints[int(s.next.Add(1)%uint64(len(s.endpoints)))]
		}
		s.links[l] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() { s.forward(l) })
	}
}

func (s *Service) forward(l *link) {
	defer s.forget(l)
	if l.to == "" {
		return // no endpoint: connection refused, as a Service without ready pods
	}
	out, err := net.Dial("tcp", l.to)
	if err != nil {
		return
	}
	s.mu.Lock()
	l.out = out
	departed := l.departed
	s.mu.Unlock()
	if departed {
		return
	}
	done := make(chan struct{}, 2)
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(*net.TCPConn); ok {
			_ = c.CloseWrite()
		}
		done <- struct{}{}
	}
	go half(out, l.in)
	go half(l.in, out)
	<-done
	<-done
}

func (s *Service) forget(l *link) {
	_ = l.in.Close()
	s.mu.Lock()
	if l.out != nil {
		_ = l.out.Close()
	}
	delete(s.links, l)
	s.mu.Unlock()
	close(l.done)
}
