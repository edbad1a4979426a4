package chart

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/kvnet/kvnet/certs"
)

// recorder is an HTTPS admission webhook that allows everything and
// remembers which paths the API server called.
type recorder struct {
	url      string
	caBundle string
	mu       sync.Mutex
	seen     []string
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	now := time.Now()
	ca, err := certs.NewCA("recorder-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := certs.NewServing(ca, nil, []net.IP{net.IPv4(127, 0, 0, 1)}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tlsPair(serving)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{url: "https://" + l.Addr().String(), caBundle: encodeB64(ca.CertPEM)}
	srv := &http.Server{Handler: http.HandlerFunc(r.serve), TLSConfig: pair, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

func (r *recorder) serve(w http.ResponseWriter, req *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(req.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.seen = append(r.seen, req.URL.Path)
	r.mu.Unlock()
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(review)
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = nil
}

func (r *recorder) paths() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

func tlsPair(kp *certs.KeyPair) (*tls.Config, error) {
	c, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{c}, MinVersion: tls.VersionTLS12}, nil
}

func encodeB64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
