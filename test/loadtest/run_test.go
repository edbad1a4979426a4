package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
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

// Once an answer is verified in full, every later one must be the same
// bytes but for its own uid: a changed byte anywhere, another request's
// uid or another server's answer fails.
func TestVerifierHoldsLaterAnswersToTheFirst(t *testing.T) {
	f, bodies := fixture(t)
	var b Body
	for _, body := range bodies {
		if body.Name == "vm" {
			b = body
		}
	}
	uid, at, err := requestUID(b.Review)
	if err != nil {
		t.Fatal(err)
	}
	answer := func(h http.Handler, n int) (string, []byte) {
		review := bytes.Clone(b.Review)
		id := fmt.Sprintf("%0*d", len(uid), n)
		copy(review[at:], id)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, newRequest(b.Path, review))
		return id, rec.Body.Bytes()
	}
	var obj struct {
		Request struct {
			Object json.RawMessage `json:"object"`
		} `json:"request"`
	}
	if err := json.Unmarshal(b.Review, &obj); err != nil {
		t.Fatal(err)
	}
	kv := f.KvnetMux()
	v := &verifier{body: b, obj: obj.Request.Object, expectPatch: true}
	id1, a1 := answer(kv, 1)
	if err := v.check(a1, id1); err != nil || v.verified.Load() == nil {
		t.Fatalf("the first answer, checked in full: %v", err)
	}
	id2, a2 := answer(kv, 2)
	if err := v.check(a2, id2); err != nil {
		t.Fatalf("a later answer: %v", err)
	}
	if err := v.check(a2, id1); err == nil {
		t.Fatal("an answer for another request's uid passed")
	}
	tampered := bytes.Clone(a2)
	i := bytes.Index(tampered, []byte(`"patch":"`)) + len(`"patch":"`) + 10
	tampered[i] ^= 1
	if err := v.check(tampered, id2); err == nil {
		t.Fatal("an answer with a changed patch passed")
	}
	id3, floorAnswer := answer(FloorMux(), 3)
	if err := v.check(floorAnswer, id3); err == nil {
		t.Fatal("the floor's answer passed as kvnet's")
	}
	if err := (&verifier{body: b, obj: obj.Request.Object, expectPatch: true}).check(floorAnswer, id3); err == nil {
		t.Fatal("the floor's answer passed the full check of kvnet's")
	}
}

// A session's runs finish the requests they have in flight and count
// them: every request the server answered is in a result, so none of one
// target's work spills into the other's turn, and the connections outlast
// each run (one TLS handshake per connection over all of them).
func TestSessionRunsCountEveryAnsweredRequest(t *testing.T) {
	_, bodies := fixture(t)
	var answered, handshakes atomic.Int64
	floor := FloorMux()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Millisecond) // a request is in flight when a run's time ends
		floor.ServeHTTP(w, r)
		answered.Add(1)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			handshakes.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	c, err := NewClient(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "example.com"
	s, err := c.NewSession(Target{Name: "floor", URL: srv.URL}, bodies[0], false, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	total := 0
	for range 3 {
		r, err := s.Run(context.Background(), 30*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		total += r.Requests
		if got := int(answered.Load()); got != total {
			t.Fatalf("the server answered %d requests, the runs counted %d", got, total)
		}
	}
	if total == 0 {
		t.Fatal("no request answered")
	}
	if n := handshakes.Load(); n > 4 {
		t.Fatalf("%d connections for a session of 4", n)
	}
}
