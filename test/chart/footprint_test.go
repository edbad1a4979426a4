package chart

import (
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
)

// maxIdleAnon bounds the anonymous resident memory of kvnet webhook,
// started as the chart starts it, once it is ready on an empty cluster
// (14 MiB when this bound was set, of an RSS of 62 MiB: the other 48 MiB
// are pages of the binary itself, file-backed and shared, which kvnet's
// own allocations do not move). A dependency or an informer that makes
// kvnet heavier at rest fails here, and the log says what holds the heap.
const maxIdleAnon = 24 << 20

// checkIdleFootprint reads the running webhook's resident memory from
// /proc and its heap through --pprof-bind-address, logs both (the heap in
// use by allocating package), and fails past maxIdleAnon.
func checkIdleFootprint(t *testing.T, pid int, pprofAddr string) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("kvnet's /proc status: %v", err)
	}
	kib := map[string]int64{}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		if f := strings.Fields(v); len(f) == 2 && f[1] == "kB" && (k == "VmRSS" || k == "VmHWM" || strings.HasPrefix(k, "Rss")) {
			kib[k], _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	resp, err := http.Get("http://" + pprofAddr + "/debug/pprof/heap?gc=1")
	if err != nil {
		t.Fatalf("kvnet's heap profile: %v", err)
	}
	defer resp.Body.Close()
	p, err := profile.Parse(resp.Body)
	if err != nil {
		t.Fatalf("kvnet's heap profile does not parse: %v", err)
	}
	inuse := -1
	for i, st := range p.SampleType {
		if st.Type == "inuse_space" {
			inuse = i
		}
	}
	if inuse < 0 {
		t.Fatalf("no inuse_space in kvnet's heap profile (%v)", p.SampleType)
	}
	byPackage := map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[inuse]
		total += v
		if v > 0 && len(s.Location) > 0 && len(s.Location[0].Line) > 0 {
			byPackage[packageOf(s.Location[0].Line[0].Function.Name)] += v
		}
	}
	pkgs := make([]string, 0, len(byPackage))
	for k := range byPackage {
		pkgs = append(pkgs, k)
	}
	sort.Slice(pkgs, func(i, j int) bool { return byPackage[pkgs[i]] > byPackage[pkgs[j]] })
	var b strings.Builder
	for _, k := range pkgs[:min(10, len(pkgs))] {
		fmt.Fprintf(&b, "\n  %7.1f KiB  %s", float64(byPackage[k])/1024, k)
	}
	t.Logf("kvnet webhook ready on an empty cluster: RSS %.1f MiB (peak %.1f; anonymous %.1f, the binary's and other files' pages %.1f), Go heap in use %.1f MiB, by allocating package:%s",
		float64(kib["VmRSS"])/1024, float64(kib["VmHWM"])/1024, float64(kib["RssAnon"])/1024, float64(kib["RssFile"])/1024, float64(total)/(1<<20), b.String())
	if kib["VmRSS"] == 0 || kib["RssAnon"] == 0 {
		t.Fatalf("no VmRSS or RssAnon in kvnet's /proc status:\n%s", status)
	}
	if anon := kib["RssAnon"] << 10; anon > maxIdleAnon {
		t.Errorf("kvnet webhook holds %.1f MiB of anonymous memory at rest, over the bound of %d MiB", float64(anon)/(1<<20), maxIdleAnon>>20)
	}
}

// packageOf is the package path of a function's full name.
func packageOf(fn string) string {
	slash := strings.LastIndex(fn, "/")
	if dot := strings.Index(fn[slash+1:], "."); dot >= 0 {
		return fn[:slash+1+dot]
	}
	return fn
}
