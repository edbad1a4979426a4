package test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/kvnet/kvnet/cmd/kvnet/app"
	"github.com/kvnet/kvnet/internal/config"
	"github.com/kvnet/kvnet/test/framework"
)

// An operator can read a running webhook's heap (--pprof-bind-address, on
// loopback): it is served, it parses as a Go heap profile, and it is the
// running manager's (its informers allocated in it). The test logs the
// heap in use by allocating package; it is the test process's, envtest's
// installed CRDs included, so it is a check of the endpoint, not a figure.
func TestHeapProfileOfARunningWebhook(t *testing.T) {
	assets, err := framework.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	crds, err := framework.CRDPaths()
	if err != nil {
		t.Fatal(err)
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: true}
	restCfg, err := te.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = te.Stop() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	opts := app.ServeOptions{Port: -1, MetricsAddr: "0", ProbeAddr: "0", PprofAddr: addr, TLSMinVersion: "1.2",
		Namespace: framework.KvnetNamespace, SeveralManagers: true}
	cfg, err := config.Parse(nil, framework.KvnetNamespace)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	mgr, err := app.NewManager(ctx, restCfg, opts, config.Static(cfg))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	syncCtx, stop := context.WithTimeout(context.Background(), 60*time.Second)
	defer stop()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("kvnet's caches never synced")
	}

	var resp *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err = http.Get("http://" + addr + "/debug/pprof/heap?gc=1")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the pprof listener starts with the manager's runnables
	}
	if err != nil {
		t.Fatalf("GET /debug/pprof/heap on %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /debug/pprof/heap: %s", resp.Status)
	}
	p, err := profile.Parse(resp.Body)
	if err != nil {
		t.Fatalf("the heap profile does not parse: %v", err)
	}
	inuse, allocated := -1, -1
	for i, st := range p.SampleType {
		switch st.Type {
		case "inuse_space":
			inuse = i
		case "alloc_space":
			allocated = i
		}
	}
	if inuse < 0 || allocated < 0 {
		t.Fatalf("no inuse_space or alloc_space in the heap profile's sample types %v", p.SampleType)
	}
	byPackage := map[string]int64{}
	var total int64
	informers := false
	for _, s := range p.Sample {
		v := s.Value[inuse]
		total += v
		if v > 0 && len(s.Location) > 0 && len(s.Location[0].Line) > 0 {
			byPackage[pkgOf(s.Location[0].Line[0].Function.Name)] += v
		}
		for _, loc := range s.Location {
			for _, line := range loc.Line {
				if strings.HasPrefix(line.Function.Name, "k8s.io/client-go/tools/cache.") {
					informers = informers || s.Value[allocated] > 0
				}
			}
		}
	}
	if !informers {
		t.Error("nothing allocated under client-go's informers: this is not kvnet's running heap")
	}
	pkgs := make([]string, 0, len(byPackage))
	for k := range byPackage {
		pkgs = append(pkgs, k)
	}
	sort.Slice(pkgs, func(i, j int) bool { return byPackage[pkgs[i]] > byPackage[pkgs[j]] })
	var b strings.Builder
	for _, k := range pkgs[:min(12, len(pkgs))] {
		fmt.Fprintf(&b, "\n  %7.1f KiB  %s", float64(byPackage[k])/1024, k)
	}
	t.Logf("heap in use after start (an empty cluster): %.1f MiB; by allocating package:%s", float64(total)/(1<<20), b.String())
}

// pkgOf is the package path of a function's full name.
func pkgOf(fn string) string {
	slash := strings.LastIndex(fn, "/")
	if dot := strings.Index(fn[slash+1:], "."); dot >= 0 {
		return fn[:slash+1+dot]
	}
	return fn
}
