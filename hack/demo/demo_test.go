package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvnet/kvnet/test/framework"
)

// The demo's kvnet part runs end to end: a fresh kvnet binary, the real
// control plane, every example with the outcome it is there to show, and
// everything stopped afterwards. KubeVirt's steps are left out here (they
// add virt-controller and virt-api and run in `make demo` itself); the
// tests below check their pure parts.
func TestDemoRunsAndStops(t *testing.T) {
	dir := t.TempDir()
	kvnet := filepath.Join(dir, "kvnet")
	build := exec.Command("go", "build", "-o", kvnet, "./cmd/kvnet")
	build.Dir = framework.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building kvnet: %v\n%s", err, out)
	}
	var out bytes.Buffer
	err := Run(t.Context(), Options{Root: framework.RepoRoot(), Kvnet: kvnet, Dir: dir, KubeVirt: false}, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"kvnet is ready and its CA bundle is in both webhook configurations",
		"VirtualMachine tenant-a/postgres: admitted; kvnet changed",
		"+           networkName: tenant-a/sriov-fast",
		"VirtualMachine tenant-a/legacy: admitted, unchanged by kvnet",
		"VirtualMachine tenant-a/bridged-vf: REFUSED",
		"spec.template.spec.networks[0].multus.networkName: Not found",
		"==> stopping kube-apiserver and etcd",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
