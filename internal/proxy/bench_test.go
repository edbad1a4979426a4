package proxy

import (
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvnet/kvnet/certs/certstest"
	"github.com/kvnet/kvnet/internal/benchmark"
	"github.com/kvnet/kvnet/internal/proxy/hop"
)

// sinkServer discards everything each connection sends and closes when the
// sender is done; echo answers each byte with itself.
func sinkServer(b *testing.B, ln net.Listener, echo bool) {
	go func() {
		_ = acceptEach(ln, func(c net.Conn) {
			if echo {
				_, _ = io.Copy(c, c)
			} else {
				_, _ = io.Copy(io.Discard, c)
			}
		})
	}()
}

// push sends per bytes on each of n parallel connections to addr and
// returns the wall time and each stream's own duration.
func push(b *testing.B, addr string, n int, per int64, buf []byte) (time.Duration, []time.Duration) {
	var wg sync.WaitGroup
	durs := make([]time.Duration, n)
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Error(err)
				return
			}
			defer c.Close()
			for left := per; left > 0; {
				k := min(left, int64(len(buf)))
				if _, err := c.Write(buf[:k]); err != nil {
					b.Error(err)
					return
				}
				left -= k
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_, _ = c.Read(make([]byte, 1)) // until the far end has read all and closed
			durs[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	return time.Since(start), durs
}

func jain(durs []time.Duration, per int64) float64 {
	var sum, sq float64
	for _, d := range durs {
		x := float64(per) / d.Seconds()
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(durs)) * sq)
}

// BenchmarkChain: throughput through the two-proxy chain (source relay ->
// hop -> target server) as a ratio to a direct loopback connection
// measured in the same run, for 1, 5 and 50 streams and each hop mode.
// Reported: Gbit/s through the chain, x-direct (chain throughput / direct
// throughput), proxy-cpu-s/GiB (CPU above the direct run's, i.e. both
// proxies' cost) and jain (fairness across the streams).
//
//	go test -run XXX -bench BenchmarkChain -benchtime 3x ./proxy/
func BenchmarkChain(b *testing.B) {
	const total = 512 << 20
	buf := make([]byte, 256<<10)
	for _, mode := range []hop.Mode{hop.ModeAuthenticated, hop.ModeTLS} {
		for _, n := range []int{1, 5, 50} {
			b.Run(fmt.Sprintf("%s/streams=%d", mode, n), func(b *testing.B) {
				a, p := certstest.New(b, "cluster-a"), certstest.New(b, "cluster-b")
				direct := listenOn(b, "127.0.0.1")
				sinkServer(b, direct, false)
				ch := startChain(b, a, p, chainOpts{mode: mode, targetHost: "127.0.0.1", targetPorts: []string{portOf(direct.Addr())}, limiter: &Limiter{Max: 1}})
				per := int64(total / n)
				b.SetBytes(per * int64(n))
				var dWall, cWall, dCPU, cCPU time.Duration
				var fair float64
				for b.Loop() {
					c0 := benchmark.CPUTime()
					w, _ := push(b, direct.Addr().String(), n, per, buf)
					dWall, dCPU = dWall+w, dCPU+benchmark.CPUTime()-c0
					c0 = benchmark.CPUTime()
					w, durs := push(b, ch.sourceAddr, n, per, buf)
					cWall, cCPU = cWall+w, cCPU+benchmark.CPUTime()-c0
					fair += jain(durs, per)
				}
				gib := float64(b.N) * float64(per*int64(n)) / (1 << 30)
				b.ReportMetric(gib*8*1.073741824/cWall.Seconds(), "Gbit/s")
				b.ReportMetric(dWall.Seconds()/cWall.Seconds(), "x-direct")
				b.ReportMetric((cCPU-dCPU).Seconds()/gib, "proxy-cpu-s/GiB")
				b.ReportMetric(fair/float64(b.N), "jain")
			})
		}
	}
}

// BenchmarkChainLatency: the p50 round trip of one byte through the chain
// and directly, and the difference the two proxies add.
//
//	go test -run XXX -bench BenchmarkChainLatency ./proxy/
func BenchmarkChainLatency(b *testing.B) {
	for _, mode := range []hop.Mode{hop.ModeAuthenticated, hop.ModeTLS} {
		b.Run(mode.String(), func(b *testing.B) {
			a, p := certstest.New(b, "cluster-a"), certstest.New(b, "cluster-b")
			echo := listenOn(b, "127.0.0.1")
			sinkServer(b, echo, true)
			ch := startChain(b, a, p, chainOpts{mode: mode, targetHost: "127.0.0.1", targetPorts: []string{portOf(echo.Addr())}})
			rtts := func(addr string) []time.Duration {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				one := []byte{1}
				var out []time.Duration
				for range 2000 {
					t0 := time.Now()
					if _, err := c.Write(one); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, one); err != nil {
						b.Fatal(err)
					}
					out = append(out, time.Since(t0))
				}
				slices.Sort(out)
				return out
			}
			var added, chainP50 time.Duration
			for b.Loop() {
				d, c := rtts(echo.Addr().String()), rtts(ch.sourceAddr)
				added += c[len(c)/2] - d[len(d)/2]
				chainP50 += c[len(c)/2]
			}
			b.ReportMetric(float64(added.Microseconds())/float64(b.N), "added-p50-µs")
			b.ReportMetric(float64(chainP50.Microseconds())/float64(b.N), "chain-p50-µs")
		})
	}
}
