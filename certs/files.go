package certs

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// writeFiles puts the serving key pair into the cert dir when it differs
// from what is there. Each file is replaced by a rename, so the certwatcher
// never reads half a file; between the two renames it may read a new
// certificate with the old key, which it rejects, keeping the old pair,
// until the key lands a moment later.
func (r *Rotator) writeFiles(st *state) error {
	if err := os.MkdirAll(r.opts.CertDir, 0o700); err != nil {
		return fmt.Errorf("creating cert dir: %w", err)
	}
	certPath := filepath.Join(r.opts.CertDir, KeyTLSCert)
	keyPath := filepath.Join(r.opts.CertDir, KeyTLSKey)
	cur, _ := os.ReadFile(certPath)
	curKey, _ := os.ReadFile(keyPath)
	if bytes.Equal(cur, st.serving.CertPEM) && bytes.Equal(curKey, st.serving.KeyPEM) {
		return nil
	}
	// Key first: a reader seeing the old certificate with the new key fails
	// just like the reverse, and the certificate's rename completes the pair.
	if err := writeAtomic(keyPath, st.serving.KeyPEM, 0o600); err != nil {
		return err
	}
	if err := writeAtomic(certPath, st.serving.CertPEM, 0o644); err != nil {
		return err
	}
	reloads.Inc()
	r.log.Info("wrote a new serving certificate to the cert dir", "dir", r.opts.CertDir,
		"notAfter", st.serving.Cert.NotAfter, "serial", st.serving.Cert.SerialNumber.String())
	return nil
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
