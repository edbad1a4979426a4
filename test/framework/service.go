package framework

import (
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
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
	conns     map[net.Conn]string // forwarded connection -> its endpoint
}

// NewService listens on 127.0.0.1 and forwards to endpoints.
func NewService(endpoints ...string) (*Service, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Service{Addr: l.Addr().String(), l: l, endpoints: endpoints, conns: map[net.Conn]string{}}
	s.wg.Go(s.accept)
	return s, nil
}

// SetEndpoints replaces the endpoints, and drops the connections to the
// ones that left, so the next call goes to the new set: the API server
// keeps its connections to a webhook alive between calls.
func (s *Service) SetEndpoints(endpoints ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endpoints = endpoints
	for c, to := range s.conns {
		if !slices.Contains(endpoints, to) {
			_ = c.Close()
		}
	}
}

// Close stops accepting, drops every forwarded connection and waits for
// the forwarding goroutines.
func (s *Service) Close() {
	_ = s.l.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
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
		var to string
		if len(s.endpoints) > 0 {
			to = s.endpoints[int(s.next.Add(1)%uint64(len(s.endpoints)))]
		}
		s.conns[in] = to
		s.mu.Unlock()
		s.wg.Go(func() { s.forward(in, to) })
	}
}

func (s *Service) forward(in net.Conn, to string) {
	defer s.forget(in)
	if to == "" {
		return // no endpoint: connection refused, as a Service without ready pods
	}
	out, err := net.Dial("tcp", to)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.conns[out] = to
	s.mu.Unlock()
	defer s.forget(out)
	done := make(chan struct{}, 2)
	half := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if c, ok := dst.(*net.TCPConn); ok {
			_ = c.CloseWrite()
		}
		done <- struct{}{}
	}
	go half(out, in)
	go half(in, out)
	<-done
	<-done
}

func (s *Service) forget(c net.Conn) {
	_ = c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}
