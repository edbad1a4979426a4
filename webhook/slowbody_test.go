package webhook_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/kvnet/kvnet/webhook"
)

// countingBody counts the Reads a handler's body has started.
type countingBody struct {
	io.ReadCloser
	reads *atomic.Int64
}

func (b countingBody) Read(p []byte) (int, error) { b.reads.Add(1); return b.ReadCloser.Read(p) }

// slowClient opens a connection that announces a body of the largest size
// kvnet accepts, sends its first byte and then nothing.
func slowClient(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: kvnet\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{", 7<<20)
	return c
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Hundreds of clients that announce a 7 MiB body and then trickle it must
// not pin 7 MiB each: the body buffer grows as bytes arrive. While they
// hang, a normal review is still answered, and once the body timeout has
// passed the server has cut every one of them off.
func TestEdgeSlowBodiesHoldLittleMemory(t *testing.T) {
	const clients = 300
	var reads, entered atomic.Int64
	edge := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") }))
	edge.BodyTimeout = 10 * time.Minute // they must all still hang when the heap is read
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		r.Body = countingBody{r.Body, &reads}
		edge.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close) // after the clients' Cleanups close them: Close waits for their handlers
	addr := srv.Listener.Addr().String()

	before := heapInUse()
	for range clients {
		slowClient(t, addr)
	}
	// Each handler has made room for its body and is waiting in its second
	// Read (the first returned the one byte sent) once reads reaches twice
	// the clients.
	poll(t, "every slow client's body read to have started", func() bool { return entered.Load() == clients && reads.Load() >= 2*clients })
	held := heapInUse() - min(before, heapInUse())
	if limit := uint64(clients) * 256 << 10; held > limit {
		t.Fatalf("%d slow clients hold %d MiB of heap, want under %d MiB (the announced 7 MiB each would be %d MiB)",
			clients, held>>20, limit>>20, clients*7)
	}
	t.Logf("%d slow clients announcing 7 MiB each hold %.1f MiB of heap", clients, float64(held)/(1<<20))

	resp, err := http.Post(srv.URL+"/x", "application/json", strings.NewReader(`{"request":{"uid":"u-normal"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"allowed":true`) || !strings.Contains(string(b), "u-normal") {
		t.Fatalf("a normal review beside the slow clients: %d %s", resp.StatusCode, b)
	}
}

// A client that sends part of its body and then stalls is cut off once
// the body timeout has passed, with a 400 (or a closed connection), so it
// holds neither a connection nor a buffer for long.
func TestEdgeBodyTimeoutCutsOffStalledClients(t *testing.T) {
	edge := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response { return admission.Allowed("") }))
	edge.BodyTimeout = 200 * time.Millisecond
	srv := httptest.NewServer(edge)
	t.Cleanup(srv.Close)
	var done atomic.Int64
	for range 20 {
		c := slowClient(t, srv.Listener.Addr().String())
		go func() {
			// The server answers and closes, or just closes: either ends this read.
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				if resp.StatusCode != http.StatusOK {
					t.Errorf("a stalled client got HTTP %d, want 200 with a 400 review inside", resp.StatusCode)
				}
			}
			done.Add(1)
		}()
	}
	poll(t, "the server to cut off every stalled client", func() bool { return done.Load() == 20 })
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// The body timeout bounds the body's read only: a handler that takes
// several timeouts to answer is answered, a body that arrives in pieces
// within the timeout is read whole, and the next request on the same
// keep-alive connection is served.
func TestEdgeBodyTimeoutSparesSlowHandlersAndTheNextRequest(t *testing.T) {
	const timeout = 500 * time.Millisecond
	edge := webhook.Webhook(admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		if string(req.UID) == "u-slow-handler" {
			start := time.Now()
			poll(t, "the handler to outlast three body timeouts", func() bool { return time.Since(start) > 3*timeout || ctx.Err() != nil })
			if ctx.Err() != nil {
				// net/http cancels a request whose connection's read
				// fails, as one with a deadline in the past does.
				return admission.Denied("the request was cut while its handler ran: " + ctx.Err().Error())
			}
		}
		return admission.Allowed("")
	}))
	edge.BodyTimeout = timeout
	srv := httptest.NewServer(edge)
	t.Cleanup(srv.Close)
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	br := bufio.NewReader(c)
	send := func(uid string, pieces int) {
		t.Helper()
		body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"` + uid + `"}}`
		fmt.Fprintf(c, "POST /x HTTP/1.1\r\nHost: kvnet\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
		for i := range pieces {
			// Each piece is written once the server has read the ones
			// before: the body arrives over about half the timeout.
			_, _ = io.WriteString(c, body[i*len(body)/pieces:(i+1)*len(body)/pieces])
			sent := time.Now()
			poll(t, "a tenth of the body timeout to pass", func() bool { return time.Since(sent) > timeout/10 })
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", uid, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"allowed":true`) || !strings.Contains(string(b), uid) {
			t.Fatalf("%s: %d %s", uid, resp.StatusCode, b)
		}
	}
	send("u-slow-handler", 1)
	send("u-in-pieces", 5)
	send("u-after", 1)
	// With no body being read, the watcher stops: an idle webhook keeps
	// no ticker running.
	poll(t, "the body watcher to stop", func() bool { return !edge.WatchingBodies() })
}

// Under steady traffic one watcher serves every body: bodies that begin
// and end between two ticks keep it running, though none is being read
// when it ticks. Requests are sent back to back for ten ticks; the watcher
// would stop only if two ticks (200 ms here) passed without a request.
func TestEdgeBodyWatcherRunsOnceUnderSteadyTraffic(t *testing.T) {
	const timeout = 400 * time.Millisecond // a tick every 100 ms
	edge := webhook.Webhook(admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	}))
	edge.BodyTimeout = timeout
	body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u"}}`)
	n := 0
	for start := time.Now(); time.Since(start) < 10*timeout/4; n++ {
		r := httptest.NewRequest(http.MethodPost, "/x", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		edge.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: %d %s", n, w.Code, w.Body)
		}
	}
	if got := edge.BodyWatchers(); got != 1 {
		t.Errorf("%d watchers started for %d requests over ten ticks, want 1", got, n)
	}
	poll(t, "the body watcher to stop", func() bool { return !edge.WatchingBodies() })
}
