// Command egressclient is the HTTPS client of the egress benchmark (`make
// bench -only egress`). The harness builds it statically and runs the same
// binary inside a sandbox (its traffic goes through paddock's egress
// proxy) and in a plain network namespace wired straight to the upstream
// (paddock out of the path). One process takes every sample of a mode, so
// that process start-up is outside the clock; it prints what it measured
// as JSON on stdout.
//
//	egressclient -mode latency -connect IP:443 -host NAME -path /x -n 500
//	egressclient -mode download -connect IP:443 -host NAME -path '/blob?n=1073741824'
//	egressclient -mode rate -connect IP:443 -host NAME -path /x -rate 1000 -duration 10s
//
// The client dials -connect for every request, whatever the host (which
// still goes into SNI and Host): the harness resolves names once,
// so DNS is not part of any measurement.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/bench/egresswire"
)

type options struct {
	mode      string
	connect   string
	url       string
	caFile    string
	n, warmup int
	rate      int
	duration  time.Duration
	conns     int
	newConn   bool
}

func main() {
	var o options
	flag.StringVar(&o.mode, "mode", "latency", "latency, download or rate")
	flag.StringVar(&o.connect, "connect", "", "ip:port every connection goes to")
	host := flag.String("host", "", "server name (SNI and Host)")
	path := flag.String("path", "/", "path (and query) to GET")
	flag.StringVar(&o.caFile, "ca", "", "PEM file of CAs trusted besides the system's")
	flag.IntVar(&o.n, "n", 100, "timed GETs (latency) or downloads (download)")
	flag.IntVar(&o.warmup, "warmup", 10, "untimed GETs first")
	flag.IntVar(&o.rate, "rate", 1000, "requests per second (rate)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "how long to hold the rate (rate)")
	flag.IntVar(&o.conns, "conns", 32, "concurrent workers (rate)")
	flag.BoolVar(&o.newConn, "new-conn", false, "a new connection per request in rate mode (latency mode always opens one)")
	flag.Parse()
	if *host != "" {
		o.url = "https://" + *host + *path
	}
	res, err := run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "egressclient:", err)
		os.Exit(1)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		res.CPUNS = ru.Utime.Nano() + ru.Stime.Nano()
	}
	json.NewEncoder(os.Stdout).Encode(res)
}

func run(o options) (*egresswire.Result, error) {
	if o.connect == "" || o.url == "" {
		return nil, errors.New("-connect and -host are required")
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		return nil, fmt.Errorf("loading system roots: %w", err)
	}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, err
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no certificate", o.caFile)
		}
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", o.connect)
		},
		TLSClientConfig:     &tls.Config{RootCAs: roots},
		DisableCompression:  true,
		MaxIdleConnsPerHost: max(o.conns, 2),
		ReadBufferSize:      64 << 10,
		WriteBufferSize:     64 << 10,
	}
	c := &http.Client{Transport: tr, Timeout: time.Minute}
	switch o.mode {
	case "latency":
		tr.DisableKeepAlives = true
		return latency(c, o)
	case "download":
		c.Timeout = 10 * time.Minute
		return download(c, o)
	case "rate":
		tr.DisableKeepAlives = o.newConn
		return rate(c, o)
	}
	return nil, fmt.Errorf("unknown -mode %q", o.mode)
}

// get GETs url and reads the whole body into buf-sized chunks.
func get(c *http.Client, url string, buf []byte) (int64, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	return do(c, req, buf)
}

func do(c *http.Client, req *http.Request, buf []byte) (int64, error) {
	url := req.URL.String()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var n int64
	for {
		m, err := resp.Body.Read(buf)
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			return n, err
		}
	}
	if resp.StatusCode != http.StatusOK {
		return n, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return n, nil
}

// latency times n GETs, each on a new connection (TCP and TLS handshakes
// included), one after another.
func latency(c *http.Client, o options) (*egresswire.Result, error) {
	buf := make([]byte, 64<<10)
	res := &egresswire.Result{}
	for i := range o.warmup + o.n {
		var connected, handshaken, wrote, firstByte time.Time
		var issuer string
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			ConnectDone: func(string, string, error) { connected = time.Now() },
			TLSHandshakeDone: func(cs tls.ConnectionState, _ error) {
				handshaken = time.Now()
				if len(cs.PeerCertificates) > 0 {
					issuer = cs.PeerCertificates[0].Issuer.CommonName
				}
			},
			WroteRequest:         func(httptrace.WroteRequestInfo) { wrote = time.Now() },
			GotFirstResponseByte: func() { firstByte = time.Now() },
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.url, nil)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if _, err := do(c, req, buf); err != nil {
			return nil, fmt.Errorf("GET %d: %w", i+1, err)
		}
		if i == 0 {
			res.Issuer = issuer
		}
		if i >= o.warmup {
			res.Samples = append(res.Samples, int64(time.Since(t0)))
			res.ConnectNS = append(res.ConnectNS, int64(connected.Sub(t0)))
			res.HandshakeNS = append(res.HandshakeNS, int64(handshaken.Sub(connected)))
			res.FirstByteNS = append(res.FirstByteNS, int64(firstByte.Sub(wrote)))
		}
	}
	return res, nil
}

// download times n GETs of a large body; the body is read and dropped.
func download(c *http.Client, o options) (*egresswire.Result, error) {
	buf := make([]byte, 256<<10)
	res := &egresswire.Result{}
	for i := range o.n {
		t0 := time.Now()
		n, err := get(c, o.url, buf)
		if err != nil {
			return nil, fmt.Errorf("download %d: %w", i+1, err)
		}
		res.Bytes = append(res.Bytes, n)
		res.Nanos = append(res.Nanos, int64(time.Since(t0)))
	}
	return res, nil
}

// rate sends rate×duration GETs, request i due at start + i/rate, from
// conns workers (worker w sends requests w, w+conns, ...). A request's
// latency runs from its due time, so a client or proxy that falls behind
// the schedule shows in the tail rather than being hidden (coordinated
// omission).
func rate(c *http.Client, o options) (*egresswire.Result, error) {
	total := int(o.duration.Seconds() * float64(o.rate))
	if total < 1 || o.conns < 1 {
		return nil, errors.New("-rate, -duration and -conns must be positive")
	}
	// Warm the connections (and the proxy's upstream pool).
	var wg sync.WaitGroup
	for range o.conns {
		wg.Add(1)
		go func() { defer wg.Done(); get(c, o.url, make([]byte, 4096)) }()
	}
	wg.Wait()

	res := &egresswire.Result{}
	samples := make([]int64, total)
	var done, failed atomic.Int64
	var errMu sync.Mutex
	start := time.Now().Add(10 * time.Millisecond)
	for w := range o.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for i := w; i < total; i += o.conns {
				due := start.Add(time.Duration(i) * time.Second / time.Duration(o.rate))
				time.Sleep(time.Until(due))
				if _, err := get(c, o.url, buf); err != nil {
					failed.Add(1)
					errMu.Lock()
					if len(res.FirstErrs) < 5 {
						res.FirstErrs = append(res.FirstErrs, err.Error())
					}
					errMu.Unlock()
					samples[i] = -1
					continue
				}
				samples[i] = int64(time.Since(due))
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	res.ElapsedNS = int64(time.Since(start))
	res.Done, res.Errors = done.Load(), failed.Load()
	for _, s := range samples {
		if s >= 0 {
			res.Samples = append(res.Samples, s)
		}
	}
	return res, nil
}
