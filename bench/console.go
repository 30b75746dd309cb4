package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/paddock-dev/paddock/api"
)

const (
	// consoleSandboxes is how many sandboxes the console's list shows
	// (issue 26: pages load in ≤ 300 ms with 200).
	consoleSandboxes = 200
	consoleLoads     = 20
	consoleBarMax    = 300 * time.Millisecond
)

func consoleMethod() []string {
	return []string{
		fmt.Sprintf("%d sandboxes (0.25 CPU, 256 MiB, 128 MiB disk each) are created and sampled for a few seconds; headless Chromium (Debian's, driven by chromedp) then loads the console's list page and a sandbox's page %d times each, alternating.", consoleSandboxes, consoleLoads),
		"A load is timed from the navigation's start to the page's `paddock-loaded` performance mark: the list's table drawn with every sandbox's state and latest sample (`GET /v1/sandboxes` and `GET /v1/metrics`), or the sandbox's header drawn (`GET /v1/sandboxes/{id}`); the list's scripts (4 KiB, and 2 KiB shared) and a sandbox page's (400 KiB with xterm.js and uPlot, minified) are in the browser's cache after the first load, as in use. Sparkline histories and charts fill in after the mark.",
		"The last row is each page's DOMContentLoaded: its HTML parsed and its script (a deferred module) run up to its first API call; what the browser and the host cost before the API answers.",
		"The browser reaches the daemon's unix socket through a loopback reverse proxy (the console needs no login there).",
	}
}

// benchConsole measures the web console's page loads with 200 sandboxes.
func benchConsole(ctx context.Context, r *rig) *section {
	s := &section{Method: consoleMethod()}
	b := bar{Issue: 26, What: fmt.Sprintf("console page load with %d sandboxes (list, sandbox page), median", consoleSandboxes), Target: "≤ 300 ms", Value: noPeerValue, Verdict: notMeasured}
	s.Bars = []bar{b}
	chromium := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			chromium = p
			break
		}
	}
	if chromium == "" {
		s.Skip = "no chromium (apt-get install chromium)"
		return s
	}
	rest := len(cgroupTree(r.cgroupParent))
	ids, err := r.createMany(ctx, consoleSandboxes, api.CreateRequest{Resources: api.Resources{CPUs: densityCPUs, MemoryBytes: densityMemory, DiskBytes: densityDisk}})
	defer func() {
		r.removeAll(ids)
		r.waitTeardowns(context.Background(), rest, teardownTimeout)
	}()
	if err != nil {
		s.Err = err
		return s
	}
	time.Sleep(3 * time.Second) // a few samples for every sandbox
	base, stop, err := r.consoleProxy()
	if err != nil {
		s.Err = err
		return s
	}
	defer stop()
	var floor []time.Duration
	list, page, err := consoleLoadTimes(ctx, chromium, base, ids[0], &floor)
	if err != nil {
		s.Err = err
		return s
	}
	ls, ps := summarize(list), summarize(page)
	t := table{Header: []string{fmt.Sprintf("page, %d sandboxes", consoleSandboxes), "n", "median", "p90", "max"}}
	t.add("list (`/ui/`)", fmt.Sprint(ls.N), ms(ls.Median), ms(ls.P90), ms(ls.Max))
	t.add("sandbox (`/ui/sandboxes/{id}`)", fmt.Sprint(ps.N), ms(ps.Median), ms(ps.P90), ms(ps.Max))
	fs := summarize(floor)
	t.add("either page's DOMContentLoaded: HTML parsed, script started", fmt.Sprint(fs.N), ms(fs.Median), ms(fs.P90), ms(fs.Max))
	s.Tables = append(s.Tables, t)
	s.Bars[0].Value = fmt.Sprintf("list %s, sandbox %s", ms(ls.Median), ms(ps.Median))
	s.Bars[0].Verdict = check(ls.Median <= consoleBarMax && ps.Median <= consoleBarMax)
	return s
}

// createMany creates n sandboxes, four at a time, returning those made.
func (r *rig) createMany(ctx context.Context, n int, req api.CreateRequest) ([]string, error) {
	var (
		mu   sync.Mutex
		ids  []string
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for range next {
				sb, err := r.create(ctx, req)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ids = append(ids, sb.ID)
				}
				mu.Unlock()
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	return ids, errors.Join(errs...)
}

// consoleProxy serves the daemon's unix socket on a loopback port, for
// the browser.
func (r *rig) consoleProxy() (string, func(), error) {
	sock := strings.TrimPrefix(r.daemon.host, "unix://")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	target, _ := url.Parse("http://paddock")
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}
	proxy.FlushInterval = -1
	hs := &http.Server{Handler: proxy}
	go hs.Serve(l)
	return "http://" + l.Addr().String(), func() { hs.Close() }, nil
}

// consoleLoadTimes loads the list and a sandbox's page in turn, after one
// warm-up load of each, and returns their load times.
func consoleLoadTimes(ctx context.Context, chromium, base, id string, floor *[]time.Duration) (list, page []time.Duration, err error) {
	profile, err := os.MkdirTemp("", "paddock-chromium-")
	if err != nil {
		return nil, nil, err
	}
	// Chromium's helpers may still write there as it exits. Its TMPDIR
	// is the profile too: Chromium leaves its singleton's directory in
	// TMPDIR when it is killed.
	defer func() {
		for range 10 {
			if os.RemoveAll(profile) == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 900), chromedp.UserDataDir(profile), chromedp.Env("TMPDIR="+profile))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(func(string, ...any) {}))
	defer cancel()
	// The browser starts on bctx: started on a load's context, it would
	// end with that load.
	if err := chromedp.Run(bctx); err != nil {
		return nil, nil, fmt.Errorf("starting chromium: %w", err)
	}
	load := func(path string) (time.Duration, error) {
		tctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		var at, parsed float64
		err := chromedp.Run(tctx, chromedp.Navigate(base+path),
			chromedp.Poll(`(performance.getEntriesByName("paddock-loaded")[0] || {}).startTime`, &at,
				chromedp.WithPollingInterval(5*time.Millisecond)),
			chromedp.Evaluate(`performance.getEntriesByType("navigation")[0].domContentLoadedEventEnd`, &parsed))
		if err != nil {
			var body string
			sctx, cancel := context.WithTimeout(bctx, 5*time.Second)
			defer cancel()
			chromedp.Run(sctx, chromedp.Text("body", &body, chromedp.ByQuery))
			return 0, fmt.Errorf("loading %s: %w (the page shows %.300q)", path, err, body)
		}
		*floor = append(*floor, time.Duration(parsed*float64(time.Millisecond)))
		return time.Duration(at * float64(time.Millisecond)), nil
	}
	for i := -1; i < consoleLoads; i++ {
		l, err := load("/ui/")
		if err != nil {
			return list, page, err
		}
		p, err := load("/ui/sandboxes/" + id)
		if err != nil {
			return list, page, err
		}
		if i >= 0 {
			list, page = append(list, l), append(page, p)
		}
	}
	return list, page, nil
}
