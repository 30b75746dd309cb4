package egress

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// The benchmarks compare one HTTPS server reached three ways from the
// same client: directly, through the proxy spliced (a domain rule), and
// through the proxy intercepted (a URL rule). Run with
//
//	go test -run '^$' -bench . -benchtime 200x ./internal/egress/

var blob = func() []byte {
	b := make([]byte, 1<<20)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}()

// bulk serves /size/N: N bytes; anything else: a short body.
var bulk = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	if err != nil {
		io.WriteString(w, "ok")
		return
	}
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	for n > 0 {
		m, err := w.Write(blob[:min(n, int64(len(blob)))])
		if err != nil {
			return
		}
		n -= int64(m)
	}
})

type benchSetup struct {
	h    *harness
	dst  netip.AddrPort
	port string
}

func setupBench(b *testing.B) *benchSetup {
	h := newHarness(b)
	srv := startTLS(b, nil, bulk, "open.example.com", "api.example.com")
	dst := serverAddr(b, srv)
	port := strconv.Itoa(int(dst.Port()))
	h.setPolicy("sb1", &api.Policy{Allow: mustRulesB(b, "open.example.com", "https://api.example.com:"+port+"/")})
	return &benchSetup{h: h, dst: dst, port: port}
}

func mustRulesB(b testing.TB, ss ...string) []api.PolicyRule {
	var rs []api.PolicyRule
	for _, s := range ss {
		r, err := ParseRule(s, nil)
		if err != nil {
			b.Fatal(err)
		}
		rs = append(rs, r)
	}
	return rs
}

// clientFor returns a client for one of the three paths and the URL host.
func (s *benchSetup) clientFor(mode string, keepAlive bool) (*http.Client, string) {
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: s.h.trust("sb1")},
		DisableKeepAlives:   !keepAlive,
		MaxIdleConnsPerHost: 64,
		DisableCompression:  true,
		ReadBufferSize:      64 << 10,
	}
	host := "open.example.com"
	switch mode {
	case "direct":
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", s.dst.String())
		}
	case "spliced":
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return s.h.dial(ctx, sb1Addr, s.dst) }
	case "intercepted":
		host = "api.example.com"
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return s.h.dial(ctx, sb1Addr, s.dst) }
	}
	return &http.Client{Transport: tr}, "https://" + host + ":" + s.port
}

func fetch(b testing.TB, c *http.Client, url string) int64 {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("%s: %d %v", url, resp.StatusCode, err)
	}
	return n
}

// BenchmarkHTTPSGet measures one small HTTPS GET: "new-conn" opens a
// connection per GET (as curl does), "keep-alive" reuses one. It reports
// the median (p50-µs) next to the mean.
func BenchmarkHTTPSGet(b *testing.B) {
	s := setupBench(b)
	for _, conn := range []string{"new-conn", "keep-alive"} {
		for _, mode := range []string{"direct", "spliced", "intercepted"} {
			b.Run(conn+"/"+mode, func(b *testing.B) {
				c, base := s.clientFor(mode, conn == "keep-alive")
				defer c.CloseIdleConnections()
				fetch(b, c, base+"/warm")
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					fetch(b, c, base+"/x")
					lat = append(lat, time.Since(t0))
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			})
		}
	}
}

// BenchmarkDownload1GiB measures the throughput of a 1 GiB download.
func BenchmarkDownload1GiB(b *testing.B) {
	s := setupBench(b)
	const size = 1 << 30
	for _, mode := range []string{"direct", "spliced", "intercepted"} {
		b.Run(mode, func(b *testing.B) {
			c, base := s.clientFor(mode, true)
			defer c.CloseIdleConnections()
			b.SetBytes(size)
			cpu0 := processCPU(b)
			for i := 0; i < b.N; i++ {
				if n := fetch(b, c, base+"/blob?n="+strconv.Itoa(size)); n != size {
					b.Fatalf("got %d bytes", n)
				}
			}
			// Client, server and proxy share this process: its CPU time
			// is what a GiB costs the three together.
			b.ReportMetric((processCPU(b)-cpu0).Seconds()/float64(b.N), "cpu-s/GiB")
		})
	}
}

// processCPU is the user and system time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRequestRate drives requests through one sandbox's proxy from
// 32 concurrent keep-alive clients and reports requests per second.
func BenchmarkRequestRate(b *testing.B) {
	s := setupBench(b)
	for _, mode := range []string{"spliced", "intercepted"} {
		b.Run(mode, func(b *testing.B) {
			c, base := s.clientFor(mode, true)
			defer c.CloseIdleConnections()
			var errs atomic.Int64
			b.SetParallelism(16)
			t0 := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.Get(base + "/x")
					if err != nil {
						errs.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						errs.Add(1)
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "req/s")
			if errs.Load() > 0 {
				b.Fatalf("%d errors", errs.Load())
			}
		})
	}
}
