package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	simOpenConns   = 256             // the open loop's connections
	simBarRate     = 5000
	simBarP99      = 20 * time.Millisecond
)

var (
	simCounts = []int{1, 10, simNodes}
	// simClients are the closed loops to every node: the most any of
	// them sustains is the gateway's closed-loop maximum.
	simClients = []int{16, simConcurrency, 256}
)

// simProfile, if set, is where the gateway's CPU profile goes
// (-gateway-profile).
var simProfile string

// simLoad is what one load phase measured.
type simLoad struct {
	wall       time.Duration
	ok, failed int
	lat        []time.Duration
	gwCPU      time.Duration // the gateway process's CPU time
	nodesCPU   time.Duration // the simulated nodes' process's
	loadCPU    time.Duration // this process's: the load generator
	hostCPU    time.Duration // every CPU's busy time, whoever spent it
	firstError string
}

func (l simLoad) rate() float64 { return float64(l.ok) / l.wall.Seconds() }

// gwCores is the share of CPUs the gateway used.
func (l simLoad) gwCores() float64 { return l.gwCPU.Seconds() / l.wall.Seconds() }

// perCreate is CPU time d per create.
func (l simLoad) perCreate(d time.Duration) time.Duration {
	if l.ok == 0 {
		return 0
	}
	return d / time.Duration(l.ok)
}

// otherCores is the CPU the host spent on others than the three parties.
func (l simLoad) otherCores() float64 {
	return max(0, (l.hostCPU-l.gwCPU-l.nodesCPU-l.loadCPU).Seconds()) / l.wall.Seconds()
}

func benchSimNodes(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		fmt.Sprintf("%d **simulated nodes** (bench/simnode.go, bench-only: each answers create, get, list, exec and delete "+
			"as a node does, over the cluster's mutual TLS and behind the node token, with no kernel work) run in a process of their own, "+
			"and a real `paddock gateway` process (GOMAXPROCS 2) routes to them from a `--nodes-file`, with `--cluster-tls` (the plain-HTTP rows: the same nodes without it). "+
			"No kube-apiserver or etcd runs: the gateway's table comes from the file, and the create path writes nothing to them (bar 3).", simNodes),
		"So that the gateway's cost is what is measured, the simulated nodes and the load generator are minimal HTTP/1.1: one goroutine per kept connection, " +
			"requests read into reused buffers, prebuilt answers (a create's differs in its id), no allocation per create.",
		fmt.Sprintf("The load generator (the bench process) sends `POST /v1/sandboxes {}` with the client token over kept connections. "+
			"**closed loop**: N clients, each sending its next create when the last answers, %v of warm-up then %v timed, "+
			"%d clients for 1, 10 and %d nodes (a fresh gateway each), and %s clients for %d nodes; the best is the closed-loop maximum. "+
			"**open loop**: %d creates/s offered on a fixed schedule for %v to %d nodes from %d connections; a create's latency runs from its "+
			"scheduled start, so a gateway that falls behind is charged for the queue.", simWarm, simPhase, simConcurrency, simNodes, simClientList(), simNodes,
			simRate, simOpen, simNodes, simOpenConns),
		fmt.Sprintf("**streams**: an exec whose output is 1 GiB of zeros, made by a simulated node in 256 KiB frames, read by the bench "+
			"through the gateway (its reverse proxy, 64 KiB buffers), %d per gateway: what the cluster's TLS costs a stream, against the same nodes over plain HTTP.", simStreams),
		"All of it shares this host's 2 cores: each process's CPU time is read from /proc (**µs per create**: gateway, simulated nodes, load generator; " +
			"**other**: what the rest of the host used meanwhile), and **creates per gateway CPU-second** says what 2 cores given to the gateway alone would sustain.",
	}}
	t := table{Header: []string{"load", "nodes", "creates/s", "p50", "p99", "failed", "gateway CPU", "µs per create: gateway", "simulated nodes", "load generator",
		"other (cores)", "creates per node (min–max)", "connections to nodes"}}
	streams := table{Header: []string{"stream", "n", "median", "throughput"}}
	var open simLoad
	var closedMax float64
	s.Err = r.simNodesRun(ctx, s, &t, &streams, &open, &closedMax)
	s.Tables = append(s.Tables, t, streams)
	rateBar := bar{Issue: 22, What: fmt.Sprintf("creates/s one gateway sustains to %d simulated nodes (2 cores)", simNodes),
		Target: fmt.Sprintf("≥ %d/s", simBarRate), Value: noPeerValue, Verdict: notMeasured}
	p99Bar := bar{Issue: 22, What: fmt.Sprintf("create latency through the gateway at %d/s offered, p99", simRate),
		Target: "≤ " + ms(simBarP99), Value: noPeerValue, Verdict: notMeasured}
	maxBar := bar{Issue: 22, What: fmt.Sprintf("closed-loop maximum through one gateway to %d simulated nodes, this host's 2 cores shared", simNodes),
		Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	if open.ok > 0 {
		sum := summarize(open.lat)
		capacity := 2 / open.perCreate(open.gwCPU).Seconds()
		rateBar.Value = fmt.Sprintf("%.0f/s achieved at %d/s offered, %d failed (gateway %.2f of 2 cores, %s per create; %.0f/s per 2 gateway cores)",
			open.rate(), simRate, open.failed, open.gwCores(), micros(open.perCreate(open.gwCPU)), capacity)
		rateBar.Verdict = check(open.rate() >= simBarRate*0.98 && open.failed == 0)
		p99Bar.Value = fmt.Sprintf("%s (p50 %s)", ms(sum.P99), ms(sum.Median))
		p99Bar.Verdict = check(sum.P99 <= simBarP99 && open.failed == 0)
	}
	if closedMax > 0 {
		maxBar.Value, maxBar.Verdict = fmt.Sprintf("%.0f/s", closedMax), reported
	}
	s.Bars = []bar{rateBar, p99Bar, maxBar}
	return s
}

// simClientList is simClients in words: "16, 64 and 256".
func simClientList() string {
	out := ""
	for i, c := range simClients {
		switch {
		case i == 0:
		case i == len(simClients)-1:
			out += " and "
		default:
			out += ", "
		}
		out += fmt.Sprint(c)
	}
	return out
}

func micros(d time.Duration) string {
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

// simNodesRun starts the simulated nodes and, for each node count, a
// gateway, and measures.
func (r *rig) simNodesRun(ctx context.Context, s *section, t, streams *table, open *simLoad, closedMax *float64) error {
	dir := filepath.Join(r.root, "simnodes")
	if err := clustertls.Generate(dir, clustertls.GenerateOptions{}); err != nil {
		return err
	}
	token, err := os.ReadFile(filepath.Join(r.root, "token"))
	if err != nil {
		return err
	}
	tok := strings.TrimSpace(string(token))
	nodeToken := "sim-node-token-" + fmt.Sprint(time.Now().UnixNano())
	nodeTokenFile := filepath.Join(dir, "node.token")
	if err := os.WriteFile(nodeTokenFile, []byte(nodeToken), 0o600); err != nil {
		return err
	}
	sim, err := startSimNodes(dir, nodeToken, simNodes)
	if err != nil {
		return fmt.Errorf("starting the simulated nodes: %w", err)
	}
	defer sim.stop()
	// measure runs one phase and adds its row.
	measure := func(g *gatewayProc, load string, count int, run func(m *simMeter) simLoad) (simLoad, error) {
		before, err := sim.stats()
		if err != nil {
			return simLoad{}, err
		}
		l := run(&simMeter{gw: g.pid(), nodes: sim.pid})
		after, err := sim.stats()
		if err != nil {
			return l, err
		}
		simRow(t, load, count, l, simSpread(before.Creates[:count], after.Creates[:count]), simSum(after.Conns)-simSum(before.Conns))
		if l.firstError != "" {
			s.note("first failed create (%s, %d nodes): %s", load, count, l.firstError)
		}
		if strings.HasPrefix(load, "closed") {
			*closedMax = max(*closedMax, l.rate())
		}
		return l, ctx.Err()
	}
	for _, count := range simCounts {
		g, err := r.startSimGateway(ctx, dir, nodeTokenFile, sim.nodes[:count], false)
		if err != nil {
			return err
		}
		err = func() error {
			defer g.stop()
			lg := &simLoader{addr: g.addr, req: simCreateRequest(g.addr, tok)}
			if count == simNodes {
				if err := simCheck(ctx, g.addr, tok); err != nil {
					return fmt.Errorf("the gateway to simulated nodes: %w", err)
				}
			}
			clients := []int{simConcurrency}
			if count == simNodes {
				clients = simClients
			}
			for _, c := range clients {
				lg.closed(ctx, nil, c, simWarm)
				if simProfile != "" && count == simNodes && c == simConcurrency {
					go func() {
						if err := saveProfile(ctx, g.debug, fmt.Sprintf("profile?seconds=%d", int(simPhase.Seconds())), simProfile); err != nil {
							r.log.Warn("profiling the gateway", "err", err)
						}
					}()
				}
				l, err := measure(g, fmt.Sprintf("closed, %d clients", c), count, func(m *simMeter) simLoad { return lg.closed(ctx, m, c, simPhase) })
				if err != nil {
					return err
				}
				r.log.Info("simnodes: measured", "nodes", count, "clients", c, "closed_rate", int(l.rate()))
			}
			if count != simNodes {
				return nil
			}
			if *open, err = measure(g, fmt.Sprintf("open, %d/s offered", simRate), count, func(m *simMeter) simLoad {
				return lg.open(ctx, m, simRate, simOpen)
			}); err != nil {
				return err
			}
			if err := streamRow(ctx, streams, "1 GiB exec output through the gateway, node over the cluster's TLS", g.addr, tok); err != nil {
				return fmt.Errorf("stream: %w", err)
			}
			return ctx.Err()
		}()
		if err != nil {
			return err
		}
	}
	// The same loads to 100 nodes over plain HTTP: what the cluster's TLS
	// costs the gateway.
	g, err := r.startSimGateway(ctx, dir, nodeTokenFile, sim.nodes, true)
	if err != nil {
		return err
	}
	defer g.stop()
	lg := &simLoader{addr: g.addr, req: simCreateRequest(g.addr, tok)}
	lg.closed(ctx, nil, simConcurrency, simWarm)
	if _, err := measure(g, fmt.Sprintf("closed, %d clients, nodes over plain HTTP", simConcurrency), simNodes, func(m *simMeter) simLoad {
		return lg.closed(ctx, m, simConcurrency, simPhase)
	}); err != nil {
		return err
	}
	if _, err := measure(g, fmt.Sprintf("open, %d/s offered, nodes over plain HTTP", simRate), simNodes, func(m *simMeter) simLoad {
		return lg.open(ctx, m, simRate, simOpen)
	}); err != nil {
		return err
	}
	if err := streamRow(ctx, streams, "1 GiB exec output through the gateway, node over plain HTTP", g.addr, tok); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	return ctx.Err()
}

func simRow(t *table, load string, nodes int, l simLoad, spread string, conns int64) {
	sum := summarize(l.lat)
	t.add(load, fmt.Sprint(nodes), fmt.Sprintf("%.0f", l.rate()), ms(sum.Median), ms(sum.P99), fmt.Sprint(l.failed),
		fmt.Sprintf("%.2f cores", l.gwCores()), micros(l.perCreate(l.gwCPU)), micros(l.perCreate(l.nodesCPU)), micros(l.perCreate(l.loadCPU)),
		fmt.Sprintf("%.2f", l.otherCores()), spread, fmt.Sprint(conns))
}

func simSum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
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

// startPiped starts cmd with pipes to its stdin and from its stdout (its
// stderr is this process's).
func startPiped(cmd *exec.Cmd) (io.WriteCloser, io.Reader, error) {
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return in, out, nil
}

// startSimNodes starts count simulated nodes in a process of their own:
// this binary again, with simNodeEnv set.
func startSimNodes(dir, token string, count int) (*simNodesProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), simNodeEnv+"=1")
	in, out, err := startPiped(cmd)
	if err != nil {
		return nil, err
	}
	p := &simNodesProc{cmd: cmd, pid: cmd.Process.Pid, in: in, out: json.NewDecoder(out)}
	if err := json.NewEncoder(in).Encode(simNodesConfig{Dir: dir, Token: token, Count: count}); err != nil {
		p.stop()
		return nil, err
	}
	if err := p.out.Decode(&p.nodes); err != nil || len(p.nodes) != count {
		p.stop()
		return nil, fmt.Errorf("the simulated nodes answered %d nodes: %v", len(p.nodes), err)
	}
	return p, nil
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
func (r *rig) startSimGateway(ctx context.Context, dir, nodeTokenFile string, nodes []simNodeInfo, plain bool) (*gatewayProc, error) {
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

// simLoader sends creates to a gateway: each client on a kept
// connection of its own, a prebuilt request written and the answer read
// without net/http, so that the load generator costs little beside the
// gateway.
type simLoader struct {
	addr string
	req  []byte
}

// simCreateRequest is the create the load generator sends.
func simCreateRequest(addr, token string) []byte {
	return []byte("POST /v1/sandboxes HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: Bearer " + token +
		"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
}

// simClient is one client's connection.
type simClient struct {
	lg *simLoader
	n  int // which of the loader's clients
	c  net.Conn
	br *bufio.Reader
}

func (cl *simClient) close() {
	if cl.c != nil {
		cl.c.Close()
		cl.c = nil
	}
}

// create sends one create and says whether it was answered 201.
func (cl *simClient) create() error {
	if cl.c == nil {
		// Clients come from many loopback addresses, as many clients
		// would: the gateway's listener bounds the connections one
		// address holds before it authenticates them (connlimit).
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+cl.n%250))}}
		c, err := d.Dial("tcp", cl.lg.addr)
		if err != nil {
			return err
		}
		cl.c, cl.br = c, bufio.NewReaderSize(c, 16<<10)
	}
	// No answer in 30 s is a failed create.
	cl.c.SetDeadline(time.Now().Add(30 * time.Second))
	code, body, err := cl.roundTrip()
	if err != nil {
		cl.close()
		return err
	}
	if code != http.StatusCreated {
		return fmt.Errorf("%d %s", code, bytes.TrimSpace(body))
	}
	return nil
}

// roundTrip writes the request and reads the answer's status, and its
// body unless it is a 201.
func (cl *simClient) roundTrip() (int, []byte, error) {
	if _, err := cl.c.Write(cl.lg.req); err != nil {
		return 0, nil, err
	}
	line, err := cl.br.ReadSlice('\n')
	if err != nil {
		return 0, nil, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.1 ")) {
		return 0, nil, fmt.Errorf("status line %q", line)
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, nil, fmt.Errorf("status line %q", line)
	}
	h, err := readSimHeaders(cl.br, nil)
	if err != nil {
		return 0, nil, err
	}
	if h.length < 0 || h.chunked {
		return 0, nil, errors.New("an answer without a content length")
	}
	length, closing := h.length, h.close
	var body []byte
	if code == http.StatusCreated {
		_, err = cl.br.Discard(length)
	} else {
		body = make([]byte, length)
		_, err = io.ReadFull(cl.br, body)
	}
	if err == nil && closing {
		err = errors.New("the gateway closed the connection")
	}
	return code, body, err
}

// simMeter reads the CPU time of the three parties and of the host.
type simMeter struct {
	gw, nodes int // pids
	t0        time.Time
	start     [4]time.Duration
}

func (m *simMeter) read() [4]time.Duration {
	gw, _ := processCPU(m.gw)
	nodes, _ := processCPU(m.nodes)
	busy, _, _ := cpuTicks()
	return [4]time.Duration{gw, nodes, selfCPU(), time.Duration(busy) * time.Second / userHZ}
}

func (m *simMeter) begin() { m.start, m.t0 = m.read(), time.Now() }

func (m *simMeter) end(l *simLoad) {
	l.wall = time.Since(m.t0)
	now := m.read()
	l.gwCPU, l.nodesCPU, l.loadCPU, l.hostCPU = now[0]-m.start[0], now[1]-m.start[1], now[2]-m.start[2], now[3]-m.start[3]
}

// phase gathers one phase's results from many goroutines.
type phase struct {
	mu   sync.Mutex
	load simLoad
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

// closed runs clients clients, each sending creates back to back, for d;
// m (nil: a warm-up) measures it.
func (lg *simLoader) closed(ctx context.Context, m *simMeter, clients int, d time.Duration) simLoad {
	var p phase
	p.load.lat = make([]time.Duration, 0, 64<<10)
	if m != nil {
		m.begin()
	}
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			cl := &simClient{lg: lg, n: i}
			defer cl.close()
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(stop) {
					return
				}
				err := cl.create()
				p.done(time.Since(t0), err)
			}
		})
	}
	wg.Wait()
	if m != nil {
		m.end(&p.load)
	}
	return p.load
}

// open offers rate creates a second on a fixed schedule for d, from
// simOpenConns connections (as many clients keep): each connection takes
// the next create of the schedule when it is free, so a create that
// waits for a free connection because the gateway fell behind is charged
// the wait (its latency runs from its scheduled start).
func (lg *simLoader) open(ctx context.Context, m *simMeter, rate int, d time.Duration) simLoad {
	var p phase
	total := int64(d.Seconds() * float64(rate))
	p.load.lat = make([]time.Duration, 0, total)
	interval := time.Second / time.Duration(rate)
	var next atomic.Int64
	m.begin()
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range simOpenConns {
		wg.Go(func() {
			cl := &simClient{lg: lg, n: i}
			defer cl.close()
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				at := t0.Add(time.Duration(i) * interval)
				if wait := time.Until(at); wait > 0 {
					time.Sleep(wait)
				}
				err := cl.create()
				p.done(time.Since(at), err)
			}
		})
	}
	wg.Wait()
	m.end(&p.load)
	return p.load
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
