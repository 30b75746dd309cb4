package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/bench/egresswire"
	"github.com/paddock-dev/paddock/client"
)

const (
	egressLatencyRounds = 10
	egressLatencyWarmup = 10
	egressDownloadSize  = 1 << 30
	egressDownloadRuns  = 3
	egressRate          = 1000
	egressRateFor       = 10 * time.Second
	egressRateConns     = 32

	egressBarLatency = time.Millisecond
	egressBarRatio   = 0.70
	egressBarRateMin = 0.99 // of egressRate

	// Where the client and the upstream's CA go in the sandbox.
	egressClientPath = "/tmp/egressclient"
	egressCAPath     = "/tmp/upstream-ca.pem"
	sandboxCAPath    = "/etc/paddock/ca.pem" // the sandbox's own CA, which paddock installs
)

// egressPath is one way to the upstream: direct (paddock out of the
// path), or through a sandbox's egress proxy, spliced or intercepted.
type egressPath struct {
	name   string
	issuer string // of the certificate the client must see
	run    func(ctx context.Context, args ...string) (*egresswire.Result, error)
}

const (
	pathDirect      = "direct (no paddock)"
	pathSpliced     = "through paddock, spliced (domain rule)"
	pathIntercepted = "through paddock, intercepted (URL rule)"
)

// egressRateRun is one rate run's outcome.
type egressRateRun struct {
	path string
	res  *egresswire.Result
	err  error
}

// egressCPU is the CPU time one download took from each party, and from
// the whole machine: its busy time also holds the kernel's network work
// done in softirq, which is charged to no process (the more hops a path
// has, the more of it), and anything else that ran meanwhile.
type egressCPU struct {
	client, server, daemon, machine time.Duration
}

// egressRun is what the egress benchmark measured.
type egressRun struct {
	latency  map[string][]time.Duration
	phases   map[string]*[3][]time.Duration // connect, TLS handshake, first byte
	download map[string][]float64           // MB/s per run
	dlCPU    map[string][]egressCPU
	rates    []egressRateRun
}

// benchEgress measures issue 4's bars: HTTPS through a sandbox's egress
// proxy against the same client with paddock out of the path.
func benchEgress(ctx context.Context, r *rig) *section {
	samples := max(10*r.opts.n, 500)
	s := &section{Method: egressMethod(samples)}
	run := &egressRun{
		latency:  map[string][]time.Duration{},
		phases:   map[string]*[3][]time.Duration{},
		download: map[string][]float64{},
		dlCPU:    map[string][]egressCPU{},
	}
	s.Err = r.egressRun(ctx, samples, run)
	egressTables(s, run)
	s.Bars = egressBars(run)
	return s
}

func (r *rig) egressRun(ctx context.Context, samples int, run *egressRun) error {
	n := r.egress
	if n == nil {
		if r.egressErr != nil {
			return fmt.Errorf("making the upstream's network: %w", r.egressErr)
		}
		return errors.New("the rig made no egress network")
	}
	bin := filepath.Join(r.root, "egressclient")
	if err := buildEgressClient(ctx, bin); err != nil {
		return err
	}
	policy := &api.Policy{Allow: []api.PolicyRule{{Match: spliceHost}, {Match: "https://" + interceptHost + "/"}}}
	return r.withSandbox(ctx, api.CreateRequest{Policy: policy}, func(id string) error {
		if err := r.egressInstall(ctx, id, bin); err != nil {
			return err
		}
		sandboxCA, err := r.sandboxCAName(ctx, id)
		if err != nil {
			return err
		}
		paths := []egressPath{
			{pathDirect, n.CAName, func(ctx context.Context, args ...string) (*egresswire.Result, error) {
				return runDirect(ctx, n, bin, append(args, "-connect", n.DirectIP+":443", "-ca", n.CAFile, "-host", spliceHost)...)
			}},
			{pathSpliced, n.CAName, func(ctx context.Context, args ...string) (*egresswire.Result, error) {
				return r.runInSandbox(ctx, id, append(args, "-connect", n.UpIP+":443", "-ca", egressCAPath, "-host", spliceHost)...)
			}},
			{pathIntercepted, sandboxCA, func(ctx context.Context, args ...string) (*egresswire.Result, error) {
				return r.runInSandbox(ctx, id, append(args, "-connect", n.UpIP+":443", "-host", interceptHost)...)
			}},
		}
		if err := r.egressLatency(ctx, paths, samples, run); err != nil {
			return err
		}
		if err := r.egressDownload(ctx, paths, run); err != nil {
			return err
		}
		return r.egressRates(ctx, paths, run)
	})
}

// buildEgressClient builds bench/egressclient statically, so that it runs
// in any sandbox image.
func buildEgressClient(ctx context.Context, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "github.com/paddock-dev/paddock/bench/egressclient")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the egress client (run the bench from the module's directory): %v: %s", err, truncate(string(b), 500))
	}
	return nil
}

// egressInstall copies the client and the upstream's CA into the sandbox.
// The sandbox's own CA (for intercepted hosts) is in its system bundle
// already.
func (r *rig) egressInstall(ctx context.Context, id, bin string) error {
	for _, f := range []struct {
		src, dst string
		mode     os.FileMode
	}{{bin, egressClientPath, 0o755}, {r.egress.CAFile, egressCAPath, 0o644}} {
		src, err := os.Open(f.src)
		if err != nil {
			return err
		}
		_, err = r.client.WriteFile(ctx, id, f.dst, src, client.WriteOptions{Mode: f.mode})
		src.Close()
		if err != nil {
			return fmt.Errorf("copying %s into the sandbox: %w", f.dst, err)
		}
	}
	return nil
}

// sandboxCAName reads the common name of the sandbox's own CA, which
// only an intercepted connection shows.
func (r *rig) sandboxCAName(ctx context.Context, id string) (string, error) {
	rc, err := r.client.ReadFile(ctx, id, sandboxCAPath)
	if err != nil {
		return "", fmt.Errorf("reading the sandbox's CA: %w", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return "", fmt.Errorf("reading the sandbox's CA: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return "", fmt.Errorf("%s holds no PEM block", sandboxCAPath)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("parsing the sandbox's CA: %w", err)
	}
	return cert.Subject.CommonName, nil
}

func (r *rig) runInSandbox(ctx context.Context, id string, args ...string) (*egresswire.Result, error) {
	var stdout, stderr bytes.Buffer
	cmd := append([]string{egressClientPath}, args...)
	st, err := r.client.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: &stdout, Stderr: &stderr})
	if err := execResult(cmd, st, err, stderr.String()); err != nil {
		return nil, err
	}
	return decodeEgress(stdout.Bytes())
}

func runDirect(ctx context.Context, n *egressNet, bin string, args ...string) (*egresswire.Result, error) {
	var stdout, stderr bytes.Buffer
	cmd := n.DirectCommand(append([]string{bin}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := runWithContext(ctx, cmd); err != nil {
		return nil, fmt.Errorf("%s: %v (stderr: %s)", strings.Join(cmd.Args, " "), err, truncate(stderr.String(), 300))
	}
	return decodeEgress(stdout.Bytes())
}

// runWithContext runs cmd, killing it if ctx ends first.
func runWithContext(ctx context.Context, cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
}

func decodeEgress(b []byte) (*egresswire.Result, error) {
	var res egresswire.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("decoding the client's output %q: %w", truncate(string(b), 200), err)
	}
	return &res, nil
}

// egressLatency takes new-connection GETs on every path, in rounds whose
// order rotates, so that drift in the machine's load falls on all paths
// alike.
func (r *rig) egressLatency(ctx context.Context, paths []egressPath, samples int, run *egressRun) error {
	per := (samples + egressLatencyRounds - 1) / egressLatencyRounds
	for round := range egressLatencyRounds {
		for k := range paths {
			p := paths[(round+k)%len(paths)]
			r.idle(ctx)
			res, err := p.run(ctx, "-mode", "latency", "-path", "/x", "-n", fmt.Sprint(per), "-warmup", fmt.Sprint(egressLatencyWarmup))
			if err != nil {
				return fmt.Errorf("latency, %s: %w", p.name, err)
			}
			// The path is what it claims: only interception shows the
			// sandbox's CA.
			if want := p.issuer; res.Issuer != want {
				return fmt.Errorf("latency, %s: the client saw a certificate issued by %q, want %q", p.name, res.Issuer, want)
			}
			run.latency[p.name] = append(run.latency[p.name], nanos(res.Samples)...)
			ph := run.phases[p.name]
			if ph == nil {
				ph = new([3][]time.Duration)
				run.phases[p.name] = ph
			}
			for k, v := range [][]int64{res.ConnectNS, res.HandshakeNS, res.FirstByteNS} {
				ph[k] = append(ph[k], nanos(v)...)
			}
		}
	}
	r.log.Info("egress latency", "samples_per_path", per*egressLatencyRounds)
	return nil
}

// egressDownload downloads 1 GiB egressDownloadRuns times on every path,
// in rotating order.
func (r *rig) egressDownload(ctx context.Context, paths []egressPath, run *egressRun) error {
	for round := range egressDownloadRuns {
		for k := range paths {
			p := paths[(round+k)%len(paths)]
			r.idle(ctx)
			// The upstream server runs in this process, which does
			// nothing else meanwhile: its CPU is the server's.
			m := startCPU(r.daemon.pid(), nil)
			busy0, _, err0 := cpuTicks()
			res, err := p.run(ctx, "-mode", "download", "-path", fmt.Sprintf("/blob?n=%d", egressDownloadSize), "-n", "1")
			u := m.stop()
			busy1, _, err1 := cpuTicks()
			if err != nil {
				return fmt.Errorf("download, %s: %w", p.name, err)
			}
			c := egressCPU{client: time.Duration(res.CPUNS), server: u.Harness, daemon: u.Daemon}
			if err0 == nil && err1 == nil {
				c.machine = time.Duration(busy1-busy0) * time.Second / userHZ
			}
			run.dlCPU[p.name] = append(run.dlCPU[p.name], c)
			for i := range res.Bytes {
				if res.Bytes[i] != egressDownloadSize {
					return fmt.Errorf("download, %s: got %d bytes, want %d", p.name, res.Bytes[i], egressDownloadSize)
				}
				run.download[p.name] = append(run.download[p.name], float64(res.Bytes[i])/1e6/(float64(res.Nanos[i])/1e9))
			}
		}
	}
	r.log.Info("egress download", "runs_per_path", egressDownloadRuns)
	return nil
}

// egressRates holds egressRate requests/s for egressRateFor on each path
// over keep-alive connections. A run that does not keep up is a result,
// not an error. (A new connection per request is not a row: at 1,000 full
// TLS handshakes a second the client and server alone take both cores of
// a small machine, with or without paddock.)
func (r *rig) egressRates(ctx context.Context, paths []egressPath, run *egressRun) error {
	for _, p := range paths {
		r.idle(ctx)
		args := []string{"-mode", "rate", "-path", "/x", "-rate", fmt.Sprint(egressRate),
			"-duration", egressRateFor.String(), "-conns", fmt.Sprint(egressRateConns)}
		res, err := p.run(ctx, args...)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		run.rates = append(run.rates, egressRateRun{path: p.name, res: res, err: err})
		r.log.Info("egress rate", "path", p.name, "err", err)
	}
	return nil
}

func egressMethod(samples int) []string {
	return []string{
		"**Upstream**: an HTTPS server (Go net/http, ECDSA P-256 certificate from a CA of the run, HTTP/2 offered) in a network " +
			"namespace of its own, reachable from the host over one veth pair. The daemon's resolver learns its two names from a DNS " +
			"server of the run; its proxy trusts the run's CA (`--egress-root-ca`).",
		"**Client**: one static Go binary (`bench/egressclient`, net/http, HTTP/1.1) for every row. Through paddock it runs in one sandbox " +
			"whose policy allows `" + spliceHost + "` (a domain rule: the proxy decides by SNI and splices the TLS bytes) and `https://" +
			interceptHost + "/` (a URL rule: the proxy terminates TLS with the sandbox's CA and decides each request); its connections to the " +
			"upstream's address are redirected to the proxy by the sandbox's nftables rules. **Direct**: the same binary in a plain network " +
			"namespace wired to the upstream by a veth pair of its own: no proxy, no nftables, no conntrack redirect.",
		"The client connects to the upstream's address itself (names resolved once, outside every clock); the proxy resolves the SNI or Host " +
			"through paddock's resolver (cached) and checks the answer, as always.",
		fmt.Sprintf("**Latency**: %d GETs of a 3-byte body per path, each on a new connection (TCP connect, full TLS 1.3 handshake, request, "+
			"response, close) as a harness's `curl` does; %d rounds whose order rotates, %d untimed GETs at the start of each. The clock runs in "+
			"the client around one GET. Added latency is the path's median minus the direct median.", samples, egressLatencyRounds, egressLatencyWarmup),
		fmt.Sprintf("**Download**: one GET of 1 GiB, body read in 256 KiB chunks and dropped, %d runs per path in rotating order; "+
			"throughput is 1 GiB over the time from request to last byte, median of the runs. CPU is each party's user+system time over "+
			"one download: the client's own (getrusage), the upstream server's (it runs in the harness, idle otherwise) and the daemon's "+
			"(the proxy; the kernel's network work is charged partly to whichever process sends); CPU machine is the busy time of all "+
			"CPUs (/proc/stat), which also holds the network work done in softirq that no process is charged for, and whatever else ran "+
			"meanwhile (it means something on a quiet machine only).", egressDownloadRuns),
		fmt.Sprintf("**Rate**: an open-loop schedule of %d GET/s for %s from %d workers (request i due at start + i/%d s), over keep-alive "+
			"connections (%d, opened and warmed before the clock). Latency runs from each request's due time, so falling behind shows in the "+
			"tail. The achieved rate is successful requests over the time from the first due time to the last answer; a pass needs no error and "+
			"at least %.0f/s.", egressRate, egressRateFor, egressRateConns, egressRate, egressRateConns, egressRate*egressBarRateMin),
	}
}

func egressTables(s *section, run *egressRun) {
	direct := summarize(run.latency[pathDirect])
	t := table{Caption: "HTTPS GET, new connection per GET:", Header: []string{"path", "n", "median", "p90", "p99", "added median", "÷ direct"}}
	for _, p := range []string{pathDirect, pathSpliced, pathIntercepted} {
		if len(run.latency[p]) == 0 {
			continue
		}
		sm := summarize(run.latency[p])
		added := "—"
		if p != pathDirect && direct.N > 0 {
			added = signedMS(sm.Median - direct.Median)
		}
		t.add(p, fmt.Sprint(sm.N), ms(sm.Median), ms(sm.P90), ms(sm.P99), added, ratio(sm.Median, direct.Median))
	}
	s.Tables = append(s.Tables, t)
	s.Tables = append(s.Tables, phaseTable(run))

	d := table{Caption: "1 GiB download (CPU: median seconds per download, of each party, and the whole machine's busy time):",
		Header: []string{"path", "runs", "median", "min", "max", "÷ direct", "CPU client", "CPU upstream server", "CPU paddock daemon", "CPU machine"}}
	directTP := medianFloat(run.download[pathDirect])
	total, machine := map[string]time.Duration{}, map[string]time.Duration{}
	for _, p := range []string{pathDirect, pathSpliced, pathIntercepted} {
		v := run.download[p]
		if len(v) == 0 {
			continue
		}
		m := medianFloat(v)
		var client, server, daemon, busy []time.Duration
		for _, c := range run.dlCPU[p] {
			client, server, daemon = append(client, c.client), append(server, c.server), append(daemon, c.daemon)
			busy = append(busy, c.machine)
		}
		c, sv, dm, mc := summarize(client).Median, summarize(server).Median, summarize(daemon).Median, summarize(busy).Median
		d.add(p, fmt.Sprint(len(v)), rateMB(m), rateMB(slices.Min(v)), rateMB(slices.Max(v)), percentOf(m, directTP),
			seconds(c), seconds(sv), seconds(dm), seconds(mc))
		total[p], machine[p] = c+sv+dm, mc
	}
	s.Tables = append(s.Tables, d)
	if direct := total[pathDirect]; direct > 0 {
		for _, p := range []string{pathSpliced, pathIntercepted} {
			if total[p] > 0 {
				s.note("%s: a GiB cost the machine %s of CPU (client, server and daemon) against %s direct; were the cores "+
					"the only limit (every core busy with this transfer), the throughput ratio would be about %s.",
					p, seconds(total[p]), seconds(direct), percentOf(float64(direct), float64(total[p])))
				if md, mp := machine[pathDirect], machine[p]; md > 0 && mp > 0 {
					s.note("%s: counting the kernel's network work that no process is charged for (softirq), the machine was busy "+
						"%s against %s direct: a ratio of about %s by CPU alone.", p, seconds(mp), seconds(md), percentOf(float64(md), float64(mp)))
				}
			}
		}
	}

	rt := table{Caption: fmt.Sprintf("%d GET/s for %s:", egressRate, egressRateFor),
		Header: []string{"path", "connections", "achieved", "ok", "errors", "median", "p90", "p99"}}
	for _, x := range run.rates {
		conn := fmt.Sprintf("%d keep-alive", egressRateConns)
		if x.err != nil {
			rt.add(x.path, conn, "failed: "+truncate(x.err.Error(), 200), "", "", "", "", "")
			continue
		}
		sm := summarize(nanos(x.res.Samples))
		rt.add(x.path, conn, fmt.Sprintf("%.0f/s", x.res.Achieved()), fmt.Sprint(x.res.Done), fmt.Sprint(x.res.Errors),
			ms(sm.Median), ms(sm.P90), ms(sm.P99))
		if len(x.res.FirstErrs) > 0 {
			s.note("%s, %s: first errors: %s", x.path, conn, strings.Join(x.res.FirstErrs, "; "))
		}
	}
	s.Tables = append(s.Tables, rt)
}

func egressBars(run *egressRun) []bar {
	var bars []bar
	direct := summarize(run.latency[pathDirect])
	for _, p := range []string{pathSpliced, pathIntercepted} {
		b := bar{Issue: 4, What: "HTTPS GET (new connection), added median latency, " + shortPath(p), Target: "≤ 1 ms",
			Value: noPeerValue, Verdict: notMeasured}
		if sm := summarize(run.latency[p]); sm.N > 0 && direct.N > 0 {
			added := sm.Median - direct.Median
			b.Value = fmt.Sprintf("%s (%s vs %s direct)", signedMS(added), ms(sm.Median), ms(direct.Median))
			b.Verdict = check(added <= egressBarLatency)
		}
		bars = append(bars, b)
	}
	directTP := medianFloat(run.download[pathDirect])
	for _, p := range []string{pathSpliced, pathIntercepted} {
		b := bar{Issue: 4, What: "1 GiB download throughput, " + shortPath(p), Target: "≥ 70% of direct",
			Value: noPeerValue, Verdict: notMeasured}
		if v := run.download[p]; len(v) > 0 && directTP > 0 {
			m := medianFloat(v)
			b.Value = fmt.Sprintf("%s (%s vs %s direct)", percentOf(m, directTP), rateMB(m), rateMB(directTP))
			b.Verdict = check(m >= egressBarRatio*directTP)
		}
		bars = append(bars, b)
	}
	for _, x := range run.rates {
		if x.path == pathDirect {
			continue
		}
		b := bar{Issue: 4, What: fmt.Sprintf("%d requests/s for %s through one sandbox's proxy, %s, keep-alive", egressRate, egressRateFor, shortPath(x.path)),
			Target: fmt.Sprintf("no errors, ≥ %.0f/s", egressRate*egressBarRateMin), Value: "failed: " + errString(x.err), Verdict: fail}
		if x.err == nil {
			sm := summarize(nanos(x.res.Samples))
			b.Value = fmt.Sprintf("%.0f/s, %d errors, p99 %s", x.res.Achieved(), x.res.Errors, ms(sm.P99))
			b.Verdict = check(x.res.Errors == 0 && x.res.Achieved() >= egressRate*egressBarRateMin)
		}
		bars = append(bars, b)
	}
	return bars
}

func shortPath(p string) string {
	switch p {
	case pathSpliced:
		return "spliced"
	case pathIntercepted:
		return "intercepted"
	}
	return p
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return truncate(err.Error(), 200)
}

func nanos(v []int64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x)
	}
	return out
}

func signedMS(d time.Duration) string {
	if d >= 0 {
		return "+" + ms(d)
	}
	return "−" + ms(-d)
}

func rateMB(v float64) string { return fmt.Sprintf("%.0f MB/s", v) }

func percentOf(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100*a/b)
}

func medianFloat(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// phaseTable splits the GET into its phases, as the client saw them
// (httptrace): where the proxy's cost lands.
func phaseTable(run *egressRun) table {
	t := table{Caption: "Where a GET's time goes (medians; added: minus the direct median):",
		Header: []string{"path", "TCP connect", "TLS handshake", "request → first byte"}}
	direct := run.phases[pathDirect]
	for _, p := range []string{pathDirect, pathSpliced, pathIntercepted} {
		ph := run.phases[p]
		if ph == nil {
			continue
		}
		row := []string{p}
		for k := range ph {
			m := summarize(ph[k]).Median
			cellText := ms(m)
			if p != pathDirect && direct != nil {
				cellText += " (" + signedMS(m-summarize(direct[k]).Median) + ")"
			}
			row = append(row, cellText)
		}
		t.add(row...)
	}
	return t
}
