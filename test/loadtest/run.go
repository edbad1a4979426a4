package loadtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kvnet/kvnet/internal/apijson"
	"github.com/kvnet/kvnet/internal/benchmark"
)

// Target is one webhook server under load.
type Target struct {
	// Name is "floor" or "kvnet" in reports ("baseline" for a second kvnet
	// it is compared with).
	Name string
	// Mode is what the server runs: "floor" (answers without a patch) or
	// "kvnet".
	Mode string
	// URL is the server's base, e.g. https://127.0.0.1:9443.
	URL string
	// PID, when set, is read from /proc for CPU time and RSS.
	PID int
}

// Result is one run: one body, one target, C connections for a while.
type Result struct {
	Body, Target string
	Conns        int
	Requests     int
	Elapsed      time.Duration
	Latencies    []time.Duration // sorted
	// CPU is the target's CPU time over the run (0 without a PID).
	CPU time.Duration
	// ClientCPU is the load tool's own CPU time over the run: it shares
	// the machine, so what it spends on an answer (reading, decoding,
	// checking it) is taken from the target.
	ClientCPU time.Duration
	// RSS is the target's resident memory after the run, HWM its peak.
	RSS, HWM int64
}

// ReqPerSec is the run's throughput.
func (r *Result) ReqPerSec() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

// Percentile returns the latency below which p (0..1) of requests finished.
func (r *Result) Percentile(p float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(p * float64(len(r.Latencies)-1))
	return r.Latencies[i]
}

// Client sends reviews over HTTPS keep-alive connections.
type Client struct {
	roots *x509.CertPool
	// ServerName, when set, is the name the server's certificate is
	// verified for instead of the URL's host (a Service's DNS name, when
	// the webhook is reached through 127.0.0.1).
	ServerName string
}

// NewClient trusts the CA bundle in caPEM.
func NewClient(caPEM []byte) (*Client, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("no certificate in the CA bundle")
	}
	return &Client{roots: roots}, nil
}

// Run sends body to t with conns connections for d and verifies every
// answer (see verifier): allowed, the request's uid, and a patch that
// Check accepts. expectPatch false means the answer must carry none.
func (c *Client) Run(ctx context.Context, t Target, b Body, expectPatch bool, conns int, d time.Duration) (*Result, error) {
	s, err := c.NewSession(t, b, expectPatch, conns)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Run(ctx, d)
}

// Session is one body sent to one target over conns keep-alive
// connections, in runs that may alternate with another target's: its
// connections, its verified answer and its uids outlast each run, so two
// targets can take turns every few hundred milliseconds without a TLS
// handshake or a first full check in each turn. On a shared machine whose
// speed moves by a tenth within seconds, short turns let both targets
// sample the same moments.
type Session struct {
	t       Target
	b       Body
	conns   int
	tr      *http.Transport
	hc      *http.Client
	uid     string
	at      int
	v       *verifier
	reviews [][]byte // each connection's copy of the review
	answers [][]byte // each connection's buffer for its answers
	sent    []int    // requests each connection has sent, for its uids
}

// NewSession prepares body b for t over conns connections; see Run for
// what expectPatch means.
func (c *Client) NewSession(t Target, b Body, expectPatch bool, conns int) (*Session, error) {
	uid, at, err := requestUID(b.Review)
	if err != nil {
		return nil, err
	}
	var obj struct {
		Request struct {
			Object json.RawMessage `json:"object"`
		} `json:"request"`
	}
	if err := json.Unmarshal(b.Review, &obj); err != nil {
		return nil, err
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: c.roots, ServerName: c.ServerName, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}},
		MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, ForceAttemptHTTP2: false,
	}
	s := &Session{
		t: t, b: b, conns: conns, tr: tr, uid: uid, at: at,
		hc:      &http.Client{Transport: tr, Timeout: 30 * time.Second},
		v:       &verifier{body: b, obj: obj.Request.Object, expectPatch: expectPatch},
		reviews: make([][]byte, conns),
		answers: make([][]byte, conns),
		sent:    make([]int, conns),
	}
	for w := range s.reviews {
		s.reviews[w] = bytes.Clone(b.Review)
	}
	return s, nil
}

// Close closes the session's connections.
func (s *Session) Close() { s.tr.CloseIdleConnections() }

// Run sends for d: each connection sends requests until d has passed and
// then finishes the one it has in flight, which counts. No request is cut
// short, so none of the target's work spills into what runs after, and
// the run's time lasts until its last answer.
func (s *Session) Run(ctx context.Context, d time.Duration) (*Result, error) {
	cpu0, _ := procCPU(s.t.PID)
	client0 := benchmark.CPUTime()
	var mu sync.Mutex
	var firstErr error
	var lats []time.Duration
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := 0; w < s.conns; w++ {
		wg.Add(1)
		go pprof.Do(runCtx, pprof.Labels("target", s.t.Name), func(runCtx context.Context) {
			defer wg.Done()
			review := s.reviews[w]
			var mine []time.Duration
			for runCtx.Err() == nil && time.Now().Before(deadline) {
				id := fmt.Sprintf("%08x-0000-4000-8000-%012x", w, s.sent[w])[:len(s.uid)]
				s.sent[w]++
				copy(review[s.at:], id)
				t0 := time.Now()
				if err := s.once(runCtx, review, id, &s.answers[w]); err != nil {
					mu.Lock()
					if firstErr == nil && runCtx.Err() == nil {
						firstErr = fmt.Errorf("%s %s: %w", s.t.Name, s.b.Name, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lats = append(lats, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		return nil, firstErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	slices.Sort(lats)
	r := &Result{Body: s.b.Name, Target: s.t.Name, Conns: s.conns, Requests: len(lats), Elapsed: elapsed, Latencies: lats, ClientCPU: benchmark.CPUTime() - client0}
	if s.t.PID > 0 {
		cpu1, err := procCPU(s.t.PID)
		if err != nil {
			return nil, err
		}
		r.CPU = cpu1 - cpu0
		r.RSS, r.HWM, _ = ProcRSS(s.t.PID)
	}
	return r, nil
}

func (s *Session) once(ctx context.Context, review []byte, uid string, buf *[]byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.t.URL+s.b.Path, bytes.NewReader(review))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	data, err := readAnswer(resp, *buf)
	*buf = data
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	return s.v.check(data, uid)
}

// readAnswer reads the body in one read when its length is stated, as
// kvnet's and controller-runtime's answers state it, into buf when it is
// large enough: each connection reads every answer into the same buffer,
// so that the load tool, sharing the machine with the server it measures,
// spends no more on a large answer than reading it (a VM's is 2.2 KB, the
// floor's 170 bytes).
func readAnswer(resp *http.Response, buf []byte) ([]byte, error) {
	if n := resp.ContentLength; n > 0 && n <= 1<<20 {
		if int64(cap(buf)) < n {
			buf = make([]byte, n)
		}
		data := buf[:n]
		_, err := io.ReadFull(resp.Body, data)
		return data, err
	}
	return io.ReadAll(resp.Body)
}

// verifier checks answers. The first one from each connection, until one
// has passed, is decoded in full: allowed, the request's uid, and a patch
// that Check accepts once applied to the object (or none, where none is
// expected). Every later answer must then be that answer byte for byte
// but for its own uid, checked where the verified answer had its own: the
// webhook answers the same body the same way every time. The load tool
// shares the machine with the webhook it measures, so what it spends on an
// answer is taken from the webhook: comparing bytes costs it far less than
// decoding each answer again (a VM's answer, with its patch, is 2.3 KB;
// the floor's 150 bytes), which counted against the webhook that patches.
type verifier struct {
	body        Body
	obj         []byte
	expectPatch bool
	// verified is the first answer that passed, around its uid.
	verified atomic.Pointer[answerTemplate]
}

type answerTemplate struct{ head, tail []byte }

func (v *verifier) check(answer []byte, uid string) error {
	if t := v.verified.Load(); t != nil {
		if len(answer) == len(t.head)+len(uid)+len(t.tail) && bytes.HasPrefix(answer, t.head) && bytes.HasSuffix(answer, t.tail) &&
			string(answer[len(t.head):len(t.head)+len(uid)]) == uid {
			return nil
		}
		return fmt.Errorf("answer %s differs from the verified %s<uid %s>%s", answer, t.head, uid, t.tail)
	}
	if err := v.decode(answer, uid); err != nil {
		return err
	}
	member := []byte(`"uid":"` + uid + `"`)
	i := bytes.Index(answer, member)
	if i < 0 || bytes.Contains(answer[i+1:], member) {
		return fmt.Errorf("answer %s does not name uid %s exactly once", answer, uid)
	}
	start := i + len(`"uid":"`)
	v.verified.CompareAndSwap(nil, &answerTemplate{head: bytes.Clone(answer[:start]), tail: bytes.Clone(answer[start+len(uid):])})
	return nil
}

// decode checks an answer in full.
func (v *verifier) decode(answer []byte, uid string) error {
	var ar admissionv1.AdmissionReview
	if err := apijson.Unmarshal(answer, &ar); err != nil || ar.Response == nil {
		return fmt.Errorf("undecodable answer %q: %v", answer, err)
	}
	if !ar.Response.Allowed {
		return fmt.Errorf("refused: %+v", ar.Response.Result)
	}
	if string(ar.Response.UID) != uid {
		return fmt.Errorf("answer for uid %q, sent %q", ar.Response.UID, uid)
	}
	patch := ar.Response.Patch
	if !v.expectPatch || v.body.Check == nil {
		if len(patch) != 0 {
			return fmt.Errorf("unexpected patch %s", patch)
		}
		return nil
	}
	out, err := applyPatch(v.obj, patch)
	if err != nil {
		return err
	}
	if err := v.body.Check(out); err != nil {
		return fmt.Errorf("patch %s: %w", patch, err)
	}
	return nil
}

// requestUID finds request.uid in a review: its value and offset.
func requestUID(review []byte) (string, int, error) {
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(review, &ar); err != nil || ar.Request == nil {
		return "", 0, fmt.Errorf("not an AdmissionReview request: %v", err)
	}
	uid := string(ar.Request.UID)
	i := bytes.Index(review, []byte(`"uid":"`+uid+`"`))
	if uid == "" || i < 0 {
		return "", 0, fmt.Errorf("request.uid not found")
	}
	return uid, i + len(`"uid":"`), nil
}

// procCPU is a process's user+system CPU time (Linux /proc).
func procCPU(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, nil
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; fields count from after its ')'.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(u+s) * time.Second / ticks, nil
}

// ProcRSS is a process's resident and peak resident memory in bytes.
func ProcRSS(pid int) (rss, hwm int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n * 1024
		case "VmHWM":
			hwm = n * 1024
		}
	}
	return rss, hwm, nil
}
