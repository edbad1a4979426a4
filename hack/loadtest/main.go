// Command kvnet-loadtest measures kvnet's webhooks over HTTPS against a
// do-nothing controller-runtime handler. It is a measuring tool, kept out of
// the kvnet binary that runs in clusters: `make loadtest` builds it into
// bin/kvnet-loadtest.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/kvnet/kvnet/test/loadtest"
)

type loadtestOptions struct {
	bodies  []string
	conns   []int
	dur     time.Duration
	turn    time.Duration
	rounds  int
	url     string
	ca      string
	pid     int
	serve   string
	port    int
	certDir string
	// profileDir, when set, makes each server write a CPU profile of the
	// whole run and a heap profile at its end there (<name>.cpu.pprof,
	// <name>.heap.pprof: floor or baseline, and kvnet), to read with go
	// tool pprof.
	profileDir string
	// baseline is what kvnet is compared with: "floor", or "kvnet" for a
	// second kvnet process, which measures the measurement: how far apart
	// two identical servers come out.
	baseline string
	// profileName names a server's profiles (internal, with --serve).
	profileName string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := command().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kvnet-loadtest:", err)
		os.Exit(1)
	}
}

func command() *cobra.Command {
	o := &loadtestOptions{}
	c := &cobra.Command{
		Use:           "kvnet-loadtest",
		SilenceUsage:  true,
		SilenceErrors: true,
		Short:         "Measure kvnet's webhooks against a do-nothing controller-runtime handler, over HTTPS",
		Long: `Sends realistic AdmissionReviews (a real API server's virt-launcher pod, a VM
and a VMI gaining four networks, and both after kvnet's patch for the
validating webhooks) over C keep-alive HTTPS connections, verifying every
answer (allowed, uid, the expected patch), and prints req/s, latency
percentiles, CPU per request and RSS.

Without --url it starts two webhook servers as child processes, both
controller-runtime's webhook server: the floor (a handler that allows
everything without reading the object) and kvnet's handlers on a built-in
cluster snapshot. The two take turns within each run, so every ratio
compares two figures of the same moments. With --baseline kvnet the first
is a second kvnet instead of the floor: two identical servers, whose ratio
shows how far the measurement itself strays from 1.00.

With --url it loads a running kvnet instead (its cluster must hold the
bodies' NADs and VMI for the patches to match; see loadtest.Cluster), and
--pid adds that process's CPU and RSS.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.serve != "" {
				// kvnet webhook's default logger: zap, Info and above, to stderr.
				ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zap.Options{})))
				return serveProfiled(cmd.Context(), o)
			}
			return runLoadtest(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	fs := c.Flags()
	fs.StringSliceVar(&o.bodies, "bodies", nil, "bodies to send (default all): launcher-pod, vm, vm-validate, vmi, vmi-validate, migration-status, virt-handler-pod")
	fs.IntSliceVarP(&o.conns, "connections", "c", []int{1, 8, 64}, "keep-alive connections per run")
	fs.DurationVarP(&o.dur, "duration", "d", 8*time.Second, "length of each run")
	fs.DurationVar(&o.turn, "turn", 500*time.Millisecond, "length of each target's turn within a run: the targets take turns, floor and kvnet, then kvnet and floor, until each has run for --duration")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; every round runs every body and connection count on every target")
	fs.StringVar(&o.url, "url", "", "base URL of a running kvnet webhook (default: start the floor and kvnet on loopback)")
	fs.StringVar(&o.ca, "ca", "", "CA bundle that verifies --url")
	fs.IntVar(&o.pid, "pid", 0, "with --url: the webhook's process id, for CPU and RSS")
	fs.StringVar(&o.serve, "serve", "", "internal: serve floor or kvnet instead of sending load")
	fs.IntVar(&o.port, "port", 0, "internal: port for --serve")
	fs.StringVar(&o.certDir, "cert-dir", "", "internal: certificates for --serve")
	fs.StringVar(&o.profileDir, "profile-dir", "", "write each server's CPU profile of the run and its heap profile at the end, and the load tool's own CPU profile, into this directory")
	fs.StringVar(&o.baseline, "baseline", "floor", "what kvnet is compared with: floor (the do-nothing handler) or kvnet (a second kvnet process: how far apart two identical servers come out, the measurement's own spread)")
	fs.StringVar(&o.profileName, "profile-name", "", "internal: the name of --serve's profiles")
	_ = fs.MarkHidden("profile-name")
	_ = fs.MarkHidden("serve")
	_ = fs.MarkHidden("port")
	_ = fs.MarkHidden("cert-dir")
	return c
}

// runLoadtest runs the load test as the flags ask. It is long on purpose:
// one sequence from the fixture through the servers, the warm-up and the
// measured rounds to the report, each block a step the output names.
func runLoadtest(ctx context.Context, out io.Writer, o *loadtestOptions) error {
	f, err := loadtest.NewFixture()
	if err != nil {
		return err
	}
	all, err := f.Bodies()
	if err != nil {
		return err
	}
	bodies := all
	if len(o.bodies) > 0 {
		bodies = nil
		for _, name := range o.bodies {
			i := indexBody(all, name)
			if i < 0 {
				return fmt.Errorf("--bodies: no body %q", name)
			}
			bodies = append(bodies, all[i])
		}
	}
	if o.baseline != "floor" && o.baseline != "kvnet" {
		return fmt.Errorf("--baseline: want floor or kvnet, got %q", o.baseline)
	}
	var targets []loadtest.Target
	var caPEM []byte
	if o.url != "" {
		if caPEM, err = os.ReadFile(o.ca); err != nil {
			return fmt.Errorf("--ca: %w", err)
		}
		targets = []loadtest.Target{{Name: "kvnet", Mode: "kvnet", URL: strings.TrimSuffix(o.url, "/"), PID: o.pid}}
	} else {
		dir, err := os.MkdirTemp("", "kvnet-loadtest-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		if caPEM, err = loadtest.WriteCerts(dir); err != nil {
			return err
		}
		if o.profileDir != "" {
			if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
				return err
			}
		}
		for i, mode := range []string{o.baseline, "kvnet"} {
			name := "kvnet"
			if i == 0 {
				name = baselineName(o.baseline)
			}
			t, stop, err := startServer(ctx, mode, name, dir, o.profileDir)
			if err != nil {
				return err
			}
			defer stop()
			targets = append(targets, t)
		}
	}
	client, err := loadtest.NewClient(caPEM)
	if err != nil {
		return err
	}
	if o.profileDir != "" {
		// The load tool's own profile: at one connection what it spends
		// reading an answer is on every request's path.
		f, err := os.Create(filepath.Join(o.profileDir, "loadtest.cpu.pprof"))
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for _, t := range targets {
		if err := client.WaitReady(ctx, t.URL, 30*time.Second); err != nil {
			return err
		}
	}
	type key struct {
		body, target string
		conns        int
	}
	results := map[key][]*loadtest.Result{}
	for round := 1; round <= o.rounds; round++ {
		for _, c := range o.conns {
			for _, b := range bodies {
				rs, err := turns(ctx, client, targets, b, c, o.dur, o.turn)
				if err != nil {
					return err
				}
				for _, r := range rs {
					fmt.Fprintf(os.Stderr, "round %d: %-12s %-5s C=%-3d %8.0f req/s p99 %s\n", round, b.Name, r.Target, c, r.ReqPerSec(), r.Percentile(0.99).Round(10*time.Microsecond))
					results[key{b.Name, r.Target, c}] = append(results[key{b.Name, r.Target, c}], r)
				}
			}
		}
	}
	base := baselineName(o.baseline)
	fmt.Fprintf(out, "| body | C | %[1]s req/s | kvnet req/s | kvnet/%[1]s | rounds' kvnet/%[1]s | %[1]s p99 ms | kvnet p50 / p90 / p99 / max ms | CPU µs/req %[1]s / kvnet | load tool's CPU µs/req %[1]s / kvnet | kvnet RSS MiB (peak) |\n", base)
	fmt.Fprintf(out, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, b := range bodies {
		for _, c := range o.conns {
			kvRounds, flRounds := results[key{b.Name, "kvnet", c}], results[key{b.Name, base, c}]
			kv, fl := merge(kvRounds), merge(flRounds)
			floorRate, ratio, rounds, floorP99 := "-", "-", "-", "-"
			if fl != nil {
				floorRate = fmt.Sprintf("%.0f", fl.ReqPerSec())
				ratio = fmt.Sprintf("%.2f", kv.ReqPerSec()/fl.ReqPerSec())
				rounds = roundRatios(kvRounds, flRounds)
				floorP99 = ms(fl.Percentile(0.99))
			}
			cpu, rss := "-", "-"
			client := fmt.Sprintf("%.0f", perRequest(kv.ClientCPU, kv.Requests))
			if fl != nil {
				client = fmt.Sprintf("%.0f / %s", perRequest(fl.ClientCPU, fl.Requests), client)
			}
			if kv.CPU > 0 {
				cpu = fmt.Sprintf("%.0f", float64(kv.CPU.Microseconds())/float64(kv.Requests))
				if fl != nil && fl.CPU > 0 {
					cpu = fmt.Sprintf("%.0f / %s", float64(fl.CPU.Microseconds())/float64(fl.Requests), cpu)
				}
				rss = fmt.Sprintf("%.0f (%.0f)", float64(kv.RSS)/(1<<20), float64(kv.HWM)/(1<<20))
			}
			fmt.Fprintf(out, "| %s `%s` | %d | %s | %.0f | %s | %s | %s | %s / %s / %s / %s | %s | %s | %s |\n", b.Name, b.Path, c, floorRate, kv.ReqPerSec(), ratio, rounds, floorP99,
				ms(kv.Percentile(0.5)), ms(kv.Percentile(0.9)), ms(kv.Percentile(0.99)), ms(kv.Percentile(1)), cpu, client, rss)
		}
	}
	return nil
}

// baselineName is the baseline's name in reports: the floor, or for a
// second kvnet "baseline", since both serve kvnet's handlers.
func baselineName(baseline string) string {
	if baseline == "floor" {
		return "floor"
	}
	return "baseline"
}

// roundRatios is the lowest and highest of the rounds' kvnet/baseline
// ratios: how far one round strays from the pooled figure.
func roundRatios(kv, base []*loadtest.Result) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for i := range min(len(kv), len(base)) {
		r := kv[i].ReqPerSec() / base[i].ReqPerSec()
		lo, hi = min(lo, r), max(hi, r)
	}
	if lo > hi {
		return "-"
	}
	return fmt.Sprintf("%.2f-%.2f", lo, hi)
}

// perRequest is d per request in microseconds.
func perRequest(d time.Duration, requests int) float64 {
	if requests == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(requests)
}

func indexBody(bodies []loadtest.Body, name string) int {
	for i, b := range bodies {
		if b.Name == name {
			return i
		}
	}
	return -1
}

// merge pools the rounds of one body, target and connection count.
func merge(rs []*loadtest.Result) *loadtest.Result {
	if len(rs) == 0 {
		return nil
	}
	m := &loadtest.Result{Body: rs[0].Body, Target: rs[0].Target, Conns: rs[0].Conns}
	for _, r := range rs {
		m.Requests += r.Requests
		m.Elapsed += r.Elapsed
		m.Latencies = append(m.Latencies, r.Latencies...)
		m.CPU += r.CPU
		m.ClientCPU += r.ClientCPU
		m.RSS = max(m.RSS, r.RSS)
		m.HWM = max(m.HWM, r.HWM)
	}
	slices.Sort(m.Latencies)
	return m
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 2, 64)
}

// startServer runs this binary with --serve mode on a free loopback port.
func startServer(ctx context.Context, mode, name, certDir, profileDir string) (loadtest.Target, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return loadtest.Target{}, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	self, err := os.Executable()
	if err != nil {
		return loadtest.Target{}, nil, err
	}
	args := []string{"--serve", mode, "--port", strconv.Itoa(port), "--cert-dir", certDir}
	if profileDir != "" {
		args = append(args, "--profile-dir", profileDir, "--profile-name", name)
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return loadtest.Target{}, nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	return loadtest.Target{Name: name, Mode: mode, URL: fmt.Sprintf("https://127.0.0.1:%d", port), PID: cmd.Process.Pid}, stop, nil
}

// turns runs body b on every target with c connections, each for d in
// turns of about turn: the first turn in the targets' order, the next in
// the reverse, and so on (floor, kvnet, kvnet, floor, floor, ...), so
// neither always runs first and what the machine does over d (another
// tenant, a frequency step, the load tool's own collector) falls on both
// alike. Each target's turns are pooled into one Result.
func turns(ctx context.Context, client *loadtest.Client, targets []loadtest.Target, b loadtest.Body, c int, d, turn time.Duration) ([]*loadtest.Result, error) {
	sessions := make([]*loadtest.Session, len(targets))
	for i, t := range targets {
		s, err := client.NewSession(t, b, t.Mode == "kvnet", c)
		if err != nil {
			return nil, err
		}
		defer s.Close()
		sessions[i] = s
	}
	n := max(1, int((d+turn/2)/turn))
	each := make([][]*loadtest.Result, len(targets))
	for k := range n {
		for j := range targets {
			i := j
			if k%2 == 1 {
				i = len(targets) - 1 - j
			}
			r, err := sessions[i].Run(ctx, d/time.Duration(n))
			if err != nil {
				return nil, err
			}
			each[i] = append(each[i], r)
		}
	}
	rs := make([]*loadtest.Result, len(targets))
	for i := range targets {
		rs[i] = merge(each[i])
	}
	return rs, nil
}

// serveProfiled serves o.serve, profiled when o.profileDir is set.
func serveProfiled(ctx context.Context, o *loadtestOptions) error {
	if o.profileDir == "" {
		return loadtest.Serve(ctx, o.serve, "127.0.0.1", o.port, o.certDir)
	}
	name := cmp.Or(o.profileName, o.serve)
	cpu, err := os.Create(filepath.Join(o.profileDir, name+".cpu.pprof"))
	if err != nil {
		return err
	}
	defer cpu.Close()
	if err := pprof.StartCPUProfile(cpu); err != nil {
		return err
	}
	serveErr := loadtest.Serve(ctx, o.serve, "127.0.0.1", o.port, o.certDir)
	pprof.StopCPUProfile()
	heap, err := os.Create(filepath.Join(o.profileDir, name+".heap.pprof"))
	if err != nil {
		return errors.Join(serveErr, err)
	}
	defer heap.Close()
	return errors.Join(serveErr, pprof.Lookup("heap").WriteTo(heap, 0))
}
