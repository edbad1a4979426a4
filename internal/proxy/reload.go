package proxy

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultCAReloadInterval is how often a CAReloader reads the peers' CA
// files again: controller-runtime's certwatcher polls key pairs as often.
const DefaultCAReloadInterval = 10 * time.Second

var caReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "kvnet_proxy_peer_ca_reloads_total",
	Help: "Reads of a changed peer CA file, by peer and result (reloaded, or failed: the file is unreadable or holds no certificate, and the previous CAs stay).",
}, []string{"peer", "result"})

// CAReloader keeps each peer's CAs in step with its CAFile, so that a
// rotated peer CA (a renewed Secret, mounted as a file) is trusted without
// a restart. controller-runtime's certwatcher watches a certificate with
// its key; a CA bundle has none, so the files are polled instead: a
// mounted Secret changes by an atomic symlink swap, which a read always
// sees whole. A file that cannot be read or parsed leaves the CAs as they
// were, counted and logged: a broken rotation must not drop a working
// peer.
type CAReloader struct {
	Peers []*Peer
	// Interval between reads; zero means DefaultCAReloadInterval.
	Interval time.Duration
	Log      logr.Logger

	last map[*Peer][]byte
}

// Start polls until ctx ends; it is a manager Runnable.
func (r *CAReloader) Start(ctx context.Context) error {
	r.last = map[*Peer][]byte{}
	for _, p := range r.Peers {
		if p.CAFile != "" {
			r.last[p], _ = os.ReadFile(p.CAFile)
		}
	}
	t := time.NewTicker(orDefault(r.Interval, DefaultCAReloadInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.reload()
		}
	}
}

// NeedLeaderElection is false: every replica verifies peers.
func (r *CAReloader) NeedLeaderElection() bool { return false }

func (r *CAReloader) reload() {
	for _, p := range r.Peers {
		if p.CAFile == "" {
			continue
		}
		data, err := os.ReadFile(p.CAFile)
		if err == nil && bytes.Equal(data, r.last[p]) {
			continue
		}
		if err == nil {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(data) {
				err = fmt.Errorf("%s holds no PEM certificate", p.CAFile)
			} else {
				p.SetCAs(pool)
				r.last[p] = data
				caReloads.WithLabelValues(p.Name, "reloaded").Inc()
				r.Log.Info("peer CAs reloaded", "peer", p.Name, "file", p.CAFile)
				continue
			}
		}
		// Counted once per change, not once per poll.
		if !bytes.Equal(data, r.last[p]) {
			r.last[p] = data
			caReloads.WithLabelValues(p.Name, "failed").Inc()
			r.Log.Error(err, "keeping the peer's previous CAs", "peer", p.Name, "file", p.CAFile)
		}
	}
}

// CheckPeers refuses a peer list whose peers cannot be told apart: a
// client certificate is the peer whose name (serverName, default name) it
// carries, so two peers with one name would make the first of them answer
// for both, whatever CA each trusts.
func CheckPeers(peers []*Peer) error {
	names := map[string]string{}
	for i, p := range peers {
		if p.Name == "" {
			return fmt.Errorf("peers[%d].name: empty", i)
		}
		n := p.serverName()
		if other, ok := names[n]; ok {
			return fmt.Errorf("peers[%d] (%s): serverName %q is also peer %s's: a certificate naming it could not be told apart", i, p.Name, n, other)
		}
		names[n] = p.Name
	}
	return nil
}
