package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// apiServerRestartTimeout bounds a kube-apiserver stop or start in
// StopAPIServer and StartAPIServer: envtest's default (20 s) is tight on a
// loaded 2-core machine.
const apiServerRestartTimeout = 90 * time.Second

// StopAPIServer kills kube-apiserver, and only it, as a crash or an OOM
// kill would: etcd keeps running, with everything stored, and kvnet's
// manager keeps running, its caches holding what they had. StartAPIServer
// brings the API server back on the same address with the same serving
// certificate and the same client CA, so every rest.Config of the test
// (kvnet's, the test client's) works again as it would after an API server
// restart in a cluster.
//
// It kills rather than asks: a graceful stop of an API server that clients
// are still watching takes envtest's whole stop timeout (20 s) before
// envtest kills it anyway (controller-runtime issue 1571).
func (e *Env) StopAPIServer() error {
	s := e.Env.ControlPlane.GetAPIServer()
	pid, err := findProcess("kube-apiserver", "--cert-dir="+s.CertDir, "--secure-port="+s.SecureServing.Port)
	if err != nil {
		return err
	}
	// envtest removes a cert dir it created itself when the process stops
	// and makes a new CA on the next start, which no client of this run
	// trusts. Keep the serving certificate in a directory of ours instead:
	// a restart then serves the same one.
	keep := filepath.Join(e.dir, "apiserver")
	if s.CertDir != keep {
		if err := os.MkdirAll(keep, 0o700); err != nil {
			return err
		}
		for _, f := range []string{"apiserver.crt", "apiserver.key", "sa-signer.crt", "sa-signer.key"} {
			b, err := os.ReadFile(filepath.Join(s.CertDir, f))
			if err != nil {
				return fmt.Errorf("keeping the API server's certificates: %w", err)
			}
			if err := os.WriteFile(filepath.Join(keep, f), b, 0o600); err != nil {
				return err
			}
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing kube-apiserver (pid %d): %w", pid, err)
	}
	// envtest reaps its child; once it has, Stop only tidies up.
	gone := func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
		return errors.Is(err, os.ErrNotExist), nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, apiServerRestartTimeout, true, gone); err != nil {
		return fmt.Errorf("kube-apiserver (pid %d) still there after SIGKILL: %w", pid, err)
	}
	// The process is reaped a moment before envtest records that it has
	// exited; a Stop in between signals a process group that no longer
	// exists (ESRCH) and returns early, leaving envtest believing the server
	// still runs, so the next Start would do nothing. Stop again until
	// envtest has seen the exit: then it only tidies up.
	stopped := func(context.Context) (bool, error) {
		switch err := s.Stop(); {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.ESRCH):
			return false, nil
		default:
			return false, fmt.Errorf("stopping kube-apiserver: %w", err)
		}
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, apiServerRestartTimeout, true, stopped); err != nil {
		return err
	}
	s.CertDir = keep
	return nil
}

// findProcess returns the pid of the process running binary with every one
// of args, from /proc (Linux, where the tests run).
func findProcess(binary string, args ...string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		argv := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		if len(argv) == 0 || filepath.Base(string(argv[0])) != binary {
			continue
		}
		matched := 0
		for _, want := range args {
			for _, a := range argv[1:] {
				if string(a) == want {
					matched++
					break
				}
			}
		}
		if matched == len(args) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no %s process with %v", binary, args)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same port, and returns once it reports healthy.
func (e *Env) StartAPIServer() error {
	s := e.Env.ControlPlane.GetAPIServer()
	s.StartTimeout = apiServerRestartTimeout
	if err := s.Start(); err != nil {
		return fmt.Errorf("starting kube-apiserver again on %s: %w", s.SecureServing.Address+":"+s.SecureServing.Port, err)
	}
	return nil
}
