package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"golang.org/x/sys/unix"
)

// The simnodes section (issue 22's bar 7): one gateway in front of 1, 10
// and 100 simulated nodes.
const (
	simNodes       = 100
	simConcurrency = 64              // closed-loop clients
	simWarm        = time.Second     // closed-loop warm-up per node count
	simPhase       = 4 * time.Second // closed-loop measure per node count
	simRate        = 5000            // the open-loop offered rate, creates/s
	simOpen        = 5 * time.Second // the open-loop measure
	simBarRate     = 5000
	simBarP99      = 20 * time.Millisecond
)

var simCounts = []int{1, 10, simNodes}

// simProfile, if set, is where the gateway's CPU profile goes
// (-gateway-profile).
var simProfile string

// simLoad is what one load phase measured.
type simLoad struct {
	wall       time.Duration
	ok, failed int
	lat        []time.Duration
	gwCPU      time.Duration // the gateway process's CPU time
	benchCPU   time.Duration // this process's: load generator and simulated nodes
	firstError string
}

func (l simLoad) rate() float64 { return float64(l.ok) / l.wall.Seconds() }

// gwCores is the share of CPUs the gateway used.
func (l simLoad) gwCores() float64 { return l.gwCPU.Seconds() / l.wall.Seconds() }

// perCreate is the gateway's CPU time per create.
func (l simLoad) perCreate() time.Duration {
	if l.ok == 0 {
		return 0
	}
	return l.gwCPU / time.Duration(l.ok)
}

func benchSimNodes(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		fmt.Sprintf("%d **simulated nodes** (bench/simnode.go, bench-only: an HTTP server each that answers create, get, list, exec and delete "+
			"as a node does, over the cluster's mutual TLS and behind the node token, with no kernel work) run in the bench process, "+
			"and a real `paddock gateway` process (GOMAXPROCS 2) routes to them from a `--nodes-file`, with `--cluster-tls` (the last row: the same nodes over plain HTTP, no `--cluster-tls`).", simNodes),
		fmt.Sprintf("The load generator (the bench process too) sends `POST /v1/sandboxes {}` with the client token over kept connections. "+
			"**closed loop**: %d clients, each sending its next create when the last answers, %v of warm-up then %v timed, for 1, 10 and %d nodes "+
			"(a fresh gateway each). **open loop**: %d creates/s offered on a fixed schedule for %v to %d nodes; a create's latency runs from its "+
			"scheduled start, so a gateway that falls behind is charged for the queue.", simConcurrency, simWarm, simPhase, simNodes, simRate, simOpen, simNodes),
		fmt.Sprintf("**streams**: an exec whose output is 1 GiB of zeros, made by a simulated node in 256 KiB frames, read by the bench "+
			"through the gateway (its reverse proxy, 64 KiB buffers), %d per gateway: what the cluster's TLS costs a stream, against the same nodes over plain HTTP.", simStreams),
		"All of it shares this host's 2 cores: the gateway's own CPU time is read from /proc, and **creates per gateway CPU-second** " +
			"says what 2 cores given to the gateway alone would sustain.",
	}}
	t := table{Header: []string{"load", "nodes", "creates/s", "p50", "p99", "failed", "gateway CPU", "gateway CPU per create", "bench process CPU", "creates per node (min–max)", "connections to nodes"}}
	streams := table{Header: []string{"stream", "n", "median", "throughput"}}
	var open simLoad
	s.Err = r.simNodesRun(ctx, s, &t, &streams, &open)
	s.Tables = append(s.Tables, t, streams)
	rateBar := bar{Issue: 22, What: fmt.Sprintf("creates/s one gateway sustains to %d simulated nodes (2 cores)", simNodes),
		Target: fmt.Sprintf("≥ %d/s", simBarRate), Value: noPeerValue, Verdict: notMeasured}
	p99Bar := bar{Issue: 22, What: fmt.Sprintf("create latency through the gateway at %d/s offered, p99", simRate),
		Target: "≤ " + ms(simBarP99), Value: noPeerValue, Verdict: notMeasured}
	if open.ok > 0 {
		sum := summarize(open.lat)
		capacity := 2 / open.perCreate().Seconds()
		rateBar.Value = fmt.Sprintf("%.0f/s achieved at %d/s offered, %d failed (gateway %.2f of 2 cores; %.0f/s per 2 gateway cores)",
			open.rate(), simRate, open.failed, open.gwCores(), capacity)
		rateBar.Verdict = check(open.rate() >= simBarRate*0.98 && open.failed == 0)
		p99Bar.Value = fmt.Sprintf("%s (p50 %s)", ms(sum.P99), ms(sum.Median))
		p99Bar.Verdict = check(sum.P99 <= simBarP99 && open.failed == 0)
	}
	s.Bars = []bar{rateBar, p99Bar}
	return s
}

// simNodesRun starts the simulated nodes and, for each node count, a
// gateway, and measures.
func (r *rig) simNodesRun(ctx context.Context, s *section, t, streams *table, open *simLoad) error {
	dir := filepath.Join(r.root, "simnodes")
	if err := clustertls.Generate(dir, clustertls.GenerateOptions{}); err != nil {
		return err
	}
	trust, err := clustertls.LoadNode(dir, []string{"127.0.0.1"}, r.log)
	if err != nil {
		return err
	}
	token, err := os.ReadFile(filepath.Join(r.root, "token"))
	if err != nil {
		return err
	}
	nodeToken := "sim-node-token-" + fmt.Sprint(time.Now().UnixNano())
	nodeTokenFile := filepath.Join(dir, "node.token")
	if err := os.WriteFile(nodeTokenFile, []byte(nodeToken), 0o600); err != nil {
		return err
	}
	var nodes []*simNode
	defer func() {
		for _, n := range nodes {
			n.stop()
		}
	}()
	for i := range simNodes {
		n, err := startSimNode(fmt.Sprintf("sim%02d", i), fmt.Sprintf("s%02d", i), nodeToken, trust)
		if err != nil {
			return err
		}
		nodes = append(nodes, n)
	}
	for _, count := range simCounts {
		g, err := r.startSimGateway(ctx, dir, nodeTokenFile, nodes[:count], false)
		if err != nil {
			return err
		}
		err = func() error {
			defer g.stop()
			lg := newSimLoader(g.addr, strings.TrimSpace(string(token)))
			defer lg.close()
			if count == simNodes {
				if err := simCheck(ctx, g.addr, strings.TrimSpace(string(token))); err != nil {
					return fmt.Errorf("the gateway to simulated nodes: %w", err)
				}
			}
			lg.closed(ctx, g.pid(), simWarm)
			before, conns := simCreates(nodes[:count]), simConns(nodes)
			if simProfile != "" && count == simNodes {
				go func() {
					if err := saveProfile(ctx, g.debug, fmt.Sprintf("profile?seconds=%d", int(simPhase.Seconds())), simProfile); err != nil {
						r.log.Warn("profiling the gateway", "err", err)
					}
				}()
			}
			l := lg.closed(ctx, g.pid(), simPhase)
			simRow(t, fmt.Sprintf("closed, %d clients", simConcurrency), count, l, simSpread(before, simCreates(nodes[:count])), simConns(nodes)-conns)
			if count == simNodes {
				before, conns = simCreates(nodes[:count]), simConns(nodes)
				*open = lg.open(ctx, g.pid(), simRate, simOpen)
				simRow(t, fmt.Sprintf("open, %d/s offered", simRate), count, *open, simSpread(before, simCreates(nodes[:count])), simConns(nodes)-conns)
			}
			if count == simNodes {
				if err := streamRow(ctx, streams, "1 GiB exec output through the gateway, node over the cluster's TLS", g.addr, strings.TrimSpace(string(token))); err != nil {
					return fmt.Errorf("stream: %w", err)
				}
			}
			if l.firstError != "" || open.firstError != "" {
				s.note("first failed create (%d nodes): %s", count, l.firstError+open.firstError)
			}
			r.log.Info("simnodes: measured", "nodes", count, "closed_rate", int(l.rate()))
			return ctx.Err()
		}()
		if err != nil {
			return err
		}
	}
	// The same closed loop to 100 nodes over plain HTTP: what the
	// cluster's TLS costs the gateway.
	g, err := r.startSimGateway(ctx, dir, nodeTokenFile, nodes, true)
	if err != nil {
		return err
	}
	defer g.stop()
	tok := strings.TrimSpace(string(token))
	lg := newSimLoader(g.addr, tok)
	defer lg.close()
	lg.closed(ctx, g.pid(), simWarm)
	before, conns := simCreates(nodes), simConns(nodes)
	l := lg.closed(ctx, g.pid(), simPhase)
	simRow(t, fmt.Sprintf("closed, %d clients, nodes over plain HTTP", simConcurrency), simNodes, l, simSpread(before, simCreates(nodes)), simConns(nodes)-conns)
	if err := streamRow(ctx, streams, "1 GiB exec output through the gateway, node over plain HTTP", g.addr, tok); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	return ctx.Err()
}

func simRow(t *table, load string, nodes int, l simLoad, spread string, conns int64) {
	sum := summarize(l.lat)
	t.add(load, fmt.Sprint(nodes), fmt.Sprintf("%.0f", l.rate()), ms(sum.Median), ms(sum.P99), fmt.Sprint(l.failed),
		fmt.Sprintf("%.2f cores", l.gwCores()), fmt.Sprintf("%.0f µs", float64(l.perCreate())/float64(time.Microsecond)),
		fmt.Sprintf("%.2f cores", l.benchCPU.Seconds()/l.wall.Seconds()), spread, fmt.Sprint(conns))
}

func simCreates(nodes []*simNode) []int64 {
	out := make([]int64, len(nodes))
	for i, n := range nodes {
		out[i] = n.creates.Load()
	}
	return out
}

func simConns(nodes []*simNode) int64 {
	var n int64
	for _, s := range nodes {
		n += s.conns.Load()
	}
	return n
}

func simSpread(before, after []int64) string {
	lo, hi := int64(-1), int64(0)
	for i := range after {
		d := after[i] - before[i]
		if lo < 0 || d < lo {
			lo = d
		}
		hi = max(hi, d)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

// gatewaySandbox creates a sandbox through the gateway at addr with the
// SDK, and returns the client (the caller closes it).
func gatewaySandbox(ctx context.Context, addr, token string) (*client.Client, *api.Sandbox, error) {
	cl, err := client.New("tcp://"+addr, client.WithToken(token))
	if err != nil {
		return nil, nil, err
	}
	sb, err := cl.Create(ctx, api.CreateRequest{})
	if err != nil {
		cl.Close()
		return nil, nil, fmt.Errorf("create: %w", err)
	}
	return cl, sb, nil
}

// simCheck drives each call of the node API a gateway routes once, with
// the SDK and raw HTTP: create, get, exec, list, delete, then get's 404.
func simCheck(ctx context.Context, addr, token string) error {
	cl, sb, err := gatewaySandbox(ctx, addr, token)
	if err != nil {
		return err
	}
	defer cl.Close()
	if _, err := cl.Get(ctx, sb.ID); err != nil {
		return fmt.Errorf("get: %w", err)
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/sandboxes/"+sb.ID+"/exec", strings.NewReader(`{"cmd":["echo","hi"]}`))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(out, []byte("hi\n")) {
		return fmt.Errorf("exec: %d %q", resp.StatusCode, out)
	}
	list, err := cl.List(ctx, client.ListOptions{})
	if err != nil || len(list) == 0 {
		return fmt.Errorf("list: %d, %v", len(list), err)
	}
	if err := cl.Delete(ctx, sb.ID, true); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if _, err := cl.Get(ctx, sb.ID); !errors.Is(err, client.ErrNotFound) {
		return fmt.Errorf("get after delete: %v, want not found", err)
	}
	return nil
}

// simStreams is how many 1 GiB streams each gateway passes (TLS, plain).
const simStreams = 2

// simStream times one exec whose output is streamSize bytes, through the
// gateway at addr from a simulated node, and checks every byte arrived.
func simStream(ctx context.Context, addr, token, id string) (time.Duration, error) {
	body := fmt.Sprintf(`{"cmd":["zeros","%d"]}`, streamSize)
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+addr+"/v1/sandboxes/"+id+"/exec", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	// The frames' headers and the start and exit frames come on top.
	if resp.StatusCode != http.StatusOK || n < streamSize {
		return 0, fmt.Errorf("stream: %d, %d bytes", resp.StatusCode, n)
	}
	return d, nil
}

// streamRow times simStreams streams through the gateway at addr.
func streamRow(ctx context.Context, t *table, what, addr, token string) error {
	cl, sb, err := gatewaySandbox(ctx, addr, token)
	if err != nil {
		return err
	}
	defer cl.Close()
	var ds []time.Duration
	for range simStreams {
		d, err := simStream(ctx, addr, token, sb.ID)
		if err != nil {
			return err
		}
		ds = append(ds, d)
	}
	med := summarize(ds).Median
	t.add(what, fmt.Sprint(len(ds)), ms(med), fmt.Sprintf("%.0f MB/s", mbps(streamSize, med)))
	return nil
}

// startSimGateway starts a gateway whose nodes file lists nodes.
func (r *rig) startSimGateway(ctx context.Context, dir, nodeTokenFile string, nodes []*simNode, plain bool) (*gatewayProc, error) {
	recs := make([]api.Node, len(nodes))
	for i, n := range nodes {
		recs[i] = n.record(plain)
	}
	b, _ := json.Marshal(recs)
	nodesFile := filepath.Join(dir, "nodes.json")
	if err := os.WriteFile(nodesFile, b, 0o600); err != nil {
		return nil, err
	}
	debug := filepath.Join(dir, "gateway-debug.sock")
	args := []string{"--token-file", filepath.Join(r.root, "token"), "--node-token-file", nodeTokenFile,
		"--nodes-file", nodesFile, "--log-level", "warn"}
	if !plain {
		args = append(args, "--cluster-tls", dir)
	}
	if simProfile != "" {
		args = append(args, "--debug-socket", debug)
	}
	g, err := r.startGatewayWith(ctx, args...)
	if g != nil {
		g.debug = debug
	}
	return g, err
}

// saveProfile fetches the profile named by query ("profile?seconds=N",
// "mutex") from a debug socket (the gateway's or the daemon's).
func saveProfile(ctx context.Context, socket, query, path string) error {
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", socket)
	}}}
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://debug/debug/pprof/"+query, nil)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func (g *gatewayProc) pid() int { return g.cmd.Process.Pid }

// simLoader sends creates to a gateway.
type simLoader struct {
	url, auth string
	c         *http.Client
}

func newSimLoader(addr, token string) *simLoader {
	tr := &http.Transport{MaxIdleConnsPerHost: 1024, MaxConnsPerHost: 1024, DisableCompression: true,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}
	return &simLoader{url: "http://" + addr + "/v1/sandboxes", auth: "Bearer " + token, c: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

func (lg *simLoader) close() { lg.c.CloseIdleConnections() }

var simBody = []byte("{}")

// create sends one create and says whether it was answered 201.
func (lg *simLoader) create(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, lg.url, bytes.NewReader(simBody))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", lg.auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := lg.c.Do(req)
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("%d %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return nil
}

// phase gathers one phase's results from many goroutines.
type phase struct {
	mu       sync.Mutex
	load     simLoad
	gw0      time.Duration
	bench0   time.Duration
	t0       time.Time
	gatewayP int
}

func startPhase(gwPID int) *phase {
	p := &phase{gatewayP: gwPID, t0: time.Now()}
	p.gw0, _ = processCPU(gwPID)
	p.bench0 = selfCPU()
	return p
}

func (p *phase) done(lat time.Duration, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.load.failed++
		if p.load.firstError == "" {
			p.load.firstError = err.Error()
		}
		return
	}
	p.load.ok++
	p.load.lat = append(p.load.lat, lat)
}

func (p *phase) end() simLoad {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.load.wall = time.Since(p.t0)
	gw1, _ := processCPU(p.gatewayP)
	p.load.gwCPU = gw1 - p.gw0
	p.load.benchCPU = selfCPU() - p.bench0
	return p.load
}

// closed runs simConcurrency clients, each sending creates back to back,
// for d.
func (lg *simLoader) closed(ctx context.Context, gwPID int, d time.Duration) simLoad {
	p := startPhase(gwPID)
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range simConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(stop) {
				t0 := time.Now()
				err := lg.create(ctx)
				p.done(time.Since(t0), err)
			}
		}()
	}
	wg.Wait()
	return p.end()
}

// open offers rate creates a second on a fixed schedule for d, from
// simConcurrency connections (as many clients keep); each create's
// latency counts from its scheduled start, so a create that waits for a
// free connection because the gateway fell behind is charged the wait.
func (lg *simLoader) open(ctx context.Context, gwPID int, rate int, d time.Duration) simLoad {
	p := startPhase(gwPID)
	total := int(d.Seconds() * float64(rate))
	interval := time.Second / time.Duration(rate)
	due := make(chan time.Time, total)
	var wg sync.WaitGroup
	for range simConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for at := range due {
				if wait := time.Until(at); wait > 0 {
					time.Sleep(wait)
				}
				err := lg.create(ctx)
				p.done(time.Since(at), err)
			}
		}()
	}
	for i := 0; i < total && ctx.Err() == nil; i++ {
		at := p.t0.Add(time.Duration(i) * interval)
		// Hand out the schedule a little ahead, so that no worker waits
		// on this loop.
		if wait := time.Until(at) - 50*time.Millisecond; wait > 0 {
			time.Sleep(wait)
		}
		due <- at
	}
	close(due)
	wg.Wait()
	return p.end()
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
