package framework

import (
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
)

// LogRecorder keeps every log line kvnet writes in the test process (beside
// the usual output), so that a test can assert that a refusal was logged
// with the fields an operator would search for.
type LogRecorder struct {
	mu      sync.Mutex
	entries []LogEntry
}

// LogEntry is one recorded line: its message and its key/value fields,
// WithValues ones included, each value printed with %v.
type LogEntry struct {
	Message string
	Fields  map[string]string
}

// Count returns how many recorded lines have message msg and carry each of
// the key/value pairs in kv.
func (r *LogRecorder) Count(msg string, kv ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
next:
	for _, e := range r.entries {
		if e.Message != msg {
			continue
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if e.Fields[kv[i]] != kv[i+1] {
				continue next
			}
		}
		n++
	}
	return n
}

func (r *LogRecorder) record(msg string, values ...[]any) {
	fields := map[string]string{}
	for _, kvs := range values {
		for i := 0; i+1 < len(kvs); i += 2 {
			fields[fmt.Sprint(kvs[i])] = fmt.Sprint(kvs[i+1])
		}
	}
	r.mu.Lock()
	r.entries = append(r.entries, LogEntry{Message: msg, Fields: fields})
	r.mu.Unlock()
}

// recordingSink passes every call to the real sink and records it.
type recordingSink struct {
	inner  logr.LogSink
	rec    *LogRecorder
	values []any
}

func (s *recordingSink) Init(info logr.RuntimeInfo) { s.inner.Init(info) }

// Enabled records every line at level 0 even when the printed output is
// errors only (the default), and debug lines as the real sink prints them.
func (s *recordingSink) Enabled(level int) bool { return level == 0 || s.inner.Enabled(level) }

func (s *recordingSink) Info(level int, msg string, kv ...any) {
	s.rec.record(msg, s.values, kv)
	if s.inner.Enabled(level) {
		s.inner.Info(level, msg, kv...)
	}
}

func (s *recordingSink) Error(err error, msg string, kv ...any) {
	s.rec.record(msg, s.values, kv, []any{"error", err})
	s.inner.Error(err, msg, kv...)
}

func (s *recordingSink) WithValues(kv ...any) logr.LogSink {
	return &recordingSink{inner: s.inner.WithValues(kv...), rec: s.rec, values: append(slices.Clip(s.values), kv...)}
}

func (s *recordingSink) WithName(name string) logr.LogSink {
	return &recordingSink{inner: s.inner.WithName(name), rec: s.rec, values: s.values}
}

// recording wraps a logger so that rec sees its lines.
func recording(l logr.Logger, rec *LogRecorder) logr.Logger {
	inner := l.GetSink()
	if cd, ok := inner.(logr.CallDepthLogSink); ok {
		inner = cd.WithCallDepth(1)
	}
	return logr.New(&recordingSink{inner: inner, rec: rec})
}

// WithCallDepth keeps the caller the real sink prints right: one frame
// more, for this wrapper.
func (s *recordingSink) WithCallDepth(depth int) logr.LogSink {
	inner := s.inner
	if cd, ok := inner.(logr.CallDepthLogSink); ok {
		inner = cd.WithCallDepth(depth)
	}
	return &recordingSink{inner: inner, rec: s.rec, values: s.values}
}
