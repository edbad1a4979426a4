package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvnet/kvnet/internal/metrics"
)

var (
	reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvnet_config_reloads_total",
		Help: "Config file reloads by result (success, failure). A failure keeps the previous config.",
	}, []string{"result"})
	lastReload = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_config_last_reload_success_timestamp_seconds",
		Help: "Unix time of the last config load that took effect.",
	})
	// lastReloadOK stays 0 while the file on disk is one kvnet refused: a
	// bad file is reported once, so the failure counter alone stops moving
	// while the replica still runs on its previous config.
	lastReloadOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvnet_config_last_reload_successful",
		Help: "1 if the config file on disk is the one in force, 0 if the last reload failed and the previous config is still used.",
	})
	// generation names the config a replica serves by the hash of its file,
	// so replicas that disagree (a kubelet that has not yet updated one
	// pod's volume, a watch that broke) are visible side by side.
	generation = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvnet_config_generation",
		Help: "Always 1; sha256 is the first 16 hex digits of the SHA-256 of the config file in force (compare with `sha256sum` of the ConfigMap's config.yaml).",
	}, []string{"sha256"})
)

// RegisterMetrics registers the config reload metrics on reg.
func RegisterMetrics(reg prometheus.Registerer) error {
	// Both results exist from the start, so the first failure is an
	// increase a rate() or increase() can see.
	reloads.WithLabelValues("success")
	reloads.WithLabelValues("failure")
	return metrics.Register(reg, reloads, lastReload, lastReloadOK, generation)
}

// Generation is the label kvnet_config_generation carries for a config
// file's bytes.
func Generation(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}

// Source hands out the current config. Readers call Get on every request; it
// is one atomic load.
type Source struct {
	current atomic.Pointer[Config]
}

// Static returns a Source that always yields c.
func Static(c *Config) *Source {
	s := &Source{}
	s.current.Store(c)
	return s
}

// Set replaces the config in force.
func (s *Source) Set(c *Config) { s.current.Store(c) }

// Get returns the config in force.
func (s *Source) Get() *Config { return s.current.Load() }

// Watcher reloads a config file when it changes. ConfigMap volumes change by
// swapping a symlink, so it watches the directory, and polls as a safety net
// for filesystems that send no events.
type Watcher struct {
	Source
	Path         string
	OwnNamespace string
	// Poll is how often the file is re-read even without events; default 10s.
	Poll time.Duration
	Log  logr.Logger

	last []byte
}

// NewWatcher loads path once; a bad file is an error, so the process does not start.
func NewWatcher(path, ownNamespace string, log logr.Logger) (*Watcher, error) {
	w := &Watcher{Path: path, OwnNamespace: ownNamespace, Log: log}
	if _, err := w.load(); err != nil {
		return nil, err
	}
	lastReloadOK.Set(1)
	return w, nil
}

// load parses the file and swaps it in; changed is false when the bytes are
// the ones already in force.
func (w *Watcher) load() (changed bool, err error) {
	data, err := os.ReadFile(w.Path)
	if err != nil {
		return false, fmt.Errorf("reading config %s: %w", w.Path, err)
	}
	if w.last != nil && bytes.Equal(data, w.last) {
		return false, nil
	}
	c, err := Parse(data, w.OwnNamespace)
	if err != nil {
		w.last = data // report a bad file once, not on every poll
		return false, fmt.Errorf("%s: %w", w.Path, err)
	}
	w.current.Store(c)
	w.last = data
	lastReload.SetToCurrentTime()
	// One process runs one watcher: the vector holds exactly the config in
	// force. A scrape between Reset and Set misses it once; no alert reads
	// a single scrape.
	generation.Reset()
	generation.WithLabelValues(Generation(data)).Set(1)
	return true, nil
}

// Reload re-reads the file now. On error the previous config stays in force.
func (w *Watcher) Reload() error {
	changed, err := w.load()
	switch {
	case err != nil:
		reloads.WithLabelValues("failure").Inc()
		lastReloadOK.Set(0)
		w.Log.Error(err, "config reload failed; keeping the previous config")
		return err
	case changed:
		reloads.WithLabelValues("success").Inc()
		lastReloadOK.Set(1)
		w.Log.Info("config reloaded", "path", w.Path)
	}
	return nil
}

// NeedLeaderElection is false: every replica serves admission, so every
// replica must reload its policy. A Watcher run only on the leader leaves the
// followers admitting under their start-up config, and two replicas of one
// install then apply two different policies.
func (*Watcher) NeedLeaderElection() bool { return false }

// Start watches until ctx ends. It satisfies controller-runtime's Runnable.
func (w *Watcher) Start(ctx context.Context) error {
	poll := w.Poll
	if poll <= 0 {
		poll = 10 * time.Second
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching config: %w", err)
	}
	defer fw.Close()
	if err := fw.Add(filepath.Dir(w.Path)); err != nil {
		w.Log.Error(err, "cannot watch the config directory; polling only", "dir", filepath.Dir(w.Path))
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-fw.Events:
			_ = w.Reload()
		case err := <-fw.Errors:
			w.Log.Error(err, "config watch error")
		case <-tick.C:
			_ = w.Reload()
		}
	}
}
