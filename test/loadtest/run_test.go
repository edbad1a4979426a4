package loadtest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"
)

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// The client drives both servers over HTTPS and verifies every answer; a
// server that answers wrongly fails the run.
func TestRunVerifiesAnswers(t *testing.T) {
	_, bodies := fixture(t)
	dir := t.TempDir()
	ca, err := WriteCerts(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ca)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	targets := map[string]Target{}
	errs := make(chan error, 2)
	for _, mode := range []string{"floor", "kvnet"} {
		port := freePort(t)
		go func() { errs <- Serve(ctx, mode, "127.0.0.1", port, dir) }()
		targets[mode] = Target{Name: mode, URL: fmt.Sprintf("https://127.0.0.1:%d", port)}
		if err := c.WaitReady(ctx, targets[mode].URL, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range bodies {
		for mode, tg := range targets {
			// On a loaded machine the TLS handshakes alone can outlast a
			// short run; a run without a request is repeated, longer.
			var r *Result
			for _, d := range []time.Duration{200 * time.Millisecond, 2 * time.Second, 10 * time.Second} {
				var err error
				if r, err = c.Run(ctx, tg, b, mode == "kvnet", 2, d); err != nil {
					t.Fatalf("%s %s: %v", mode, b.Name, err)
				}
				if r.Requests > 0 {
					break
				}
			}
			if r.Requests == 0 || r.Percentile(0.99) <= 0 {
				t.Fatalf("%s %s: %d requests", mode, b.Name, r.Requests)
			}
		}
	}
	// The floor never patches, so holding it to kvnet's patch must fail.
	if r, err := c.Run(ctx, targets["floor"], bodies[0], true, 1, 5*time.Second); err == nil {
		t.Fatalf("%d floor answers passed as kvnet's patched answer", r.Requests)
	}
	cancel()
	for range targets {
		if err := <-errs; err != nil {
			t.Fatalf("server: %v", err)
		}
	}
}
