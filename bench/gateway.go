package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/freeport"
)

const (
	gatewayTag       = "g" // the daemon's --id-prefix when the gateway section runs
	gatewayExecs     = 400 // exec round trips per side
	gatewayCreates   = 30  // create → first output per side
	gatewayStreams   = 3   // 1 GiB cats per side
	gatewayExecBar   = 500 * time.Microsecond
	gatewayCreateBar = time.Millisecond
	gatewayStreamBar = 0.8
)

// gatewayArgs are the daemon's extra flags when the gateway section runs:
// a TCP listener (the token is the E2B facade's) and ids that carry a tag.
func gatewayArgs() (addr string, args []string, err error) {
	if addr, err = freeport.Addr(); err != nil {
		return "", nil, err
	}
	return addr, []string{"--listen", "tcp://" + addr, "--id-prefix", gatewayTag}, nil
}

// gatewayRun is what the gateway section measured, direct and through.
type gatewayRun struct {
	Exec, ExecGW     []time.Duration
	Create, CreateGW []time.Duration
	Answer, AnswerGW []time.Duration // the create's answer alone
	Stream, StreamGW []time.Duration
}

// benchGateway compares the daemon's own TCP listener with a `paddock
// gateway` in front of it (one node), the two taking turns sample by
// sample so that the host's noise falls on both alike.
func benchGateway(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		"The daemon listens on TCP (127.0.0.1, bearer token) and a `paddock gateway` process on another loopback port routes to it " +
			"(`--node bench=" + gatewayTag + "@http://…`; the daemon runs with `--id-prefix " + gatewayTag + "`). Two Go SDK clients, " +
			"**direct** (the daemon's TCP listener) and **gateway**, take turns sample by sample.",
		fmt.Sprintf("**exec**: `Exec(true)` in one running sandbox, %d timed round trips per client after 20 warm-ups "+
			"(lanes bound to the sandbox, as the SDK keeps them; through the gateway the lane is spliced).", gatewayExecs),
		fmt.Sprintf("**create → first output**: `Create` then `Exec(echo hi)`, clock stopped at the first stdout byte; %d per client, "+
			"delete untimed, the daemon idle before each.", gatewayCreates),
		fmt.Sprintf("**stream**: `Exec(cat /tmp/f)` of a 1 GiB file in the page cache into a byte counter, %d per client after a warm-up each.", gatewayStreams),
	}}
	var run gatewayRun
	s.Err = r.gatewayCompare(ctx, &run)
	t := table{Header: []string{"measure", "n", "direct median", "gateway median", "gateway − direct", "direct p90", "gateway p90"}}
	for _, row := range []struct {
		name   string
		a, b   []time.Duration
		stream bool
	}{
		{"exec round trip of `true`", run.Exec, run.ExecGW, false},
		{"create → first output of `echo hi`", run.Create, run.CreateGW, false},
		{"… of which the create's answer", run.Answer, run.AnswerGW, false},
		{"1 GiB `cat`", run.Stream, run.StreamGW, true},
	} {
		if len(row.a) == 0 || len(row.b) == 0 {
			continue
		}
		a, b := summarize(row.a), summarize(row.b)
		t.add(row.name, fmt.Sprint(a.N), ms(a.Median), ms(b.Median), ms(b.Median-a.Median), ms(a.P90), ms(b.P90))
	}
	s.Tables = append(s.Tables, t)
	s.Bars = gatewayBars(&run)
	return s
}

func gatewayBars(run *gatewayRun) []bar {
	execBar := bar{Issue: 22, What: "exec round trip through a gateway, median", Target: "≤ direct + 0.5 ms", Value: noPeerValue, Verdict: notMeasured}
	createBar := bar{Issue: 22, What: "create → first output through a gateway, median", Target: "≤ direct + 1 ms", Value: noPeerValue, Verdict: notMeasured}
	streamBar := bar{Issue: 22, What: "1 GiB `cat` through a gateway", Target: "≥ 80% of direct", Value: noPeerValue, Verdict: notMeasured}
	if len(run.Exec) > 0 && len(run.ExecGW) > 0 {
		a, b := summarize(run.Exec).Median, summarize(run.ExecGW).Median
		execBar.Value = fmt.Sprintf("%s (direct %s)", ms(b), ms(a))
		execBar.Verdict = check(b <= a+gatewayExecBar)
	}
	if len(run.Create) > 0 && len(run.CreateGW) > 0 {
		a, b := summarize(run.Create).Median, summarize(run.CreateGW).Median
		createBar.Value = fmt.Sprintf("%s (direct %s)", ms(b), ms(a))
		createBar.Verdict = check(b <= a+gatewayCreateBar)
	}
	if len(run.Stream) > 0 && len(run.StreamGW) > 0 {
		a, b := mbps(streamSize, summarize(run.Stream).Median), mbps(streamSize, summarize(run.StreamGW).Median)
		streamBar.Value = fmt.Sprintf("%.0f MB/s, %.0f%% of direct (%.0f MB/s)", b, 100*b/a, a)
		streamBar.Verdict = check(b >= gatewayStreamBar*a)
	}
	return []bar{execBar, createBar, streamBar}
}

// gatewayCompare starts the gateway and takes the samples.
func (r *rig) gatewayCompare(ctx context.Context, run *gatewayRun) error {
	if r.nodeAddr == "" {
		return errors.New("the daemon has no TCP listener (the rig adds one when the gateway section is selected)")
	}
	token, err := os.ReadFile(filepath.Join(r.root, "token"))
	if err != nil {
		return err
	}
	gw, err := r.startGateway(ctx)
	if err != nil {
		return err
	}
	defer gw.stop()
	direct, err := client.New("tcp://"+r.nodeAddr, client.WithToken(string(token)))
	if err != nil {
		return err
	}
	defer direct.Close()
	through, err := client.New("tcp://"+gw.addr, client.WithToken(string(token)))
	if err != nil {
		return err
	}
	defer through.Close()
	sides := []*client.Client{direct, through}

	// exec round trips
	err = r.withSandbox(ctx, api.CreateRequest{}, func(id string) error {
		for _, c := range sides {
			for range 20 {
				if _, err := timedExec(ctx, c, id, "true"); err != nil {
					return err
				}
			}
		}
		r.idle(ctx)
		for range gatewayExecs {
			for i, c := range sides {
				d, err := timedExec(ctx, c, id, "true")
				if err != nil {
					return err
				}
				if i == 0 {
					run.Exec = append(run.Exec, d)
				} else {
					run.ExecGW = append(run.ExecGW, d)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	r.log.Info("gateway: exec done")

	// create → first output
	for range gatewayCreates {
		for i, c := range sides {
			r.idle(ctx)
			d, answer, err := r.createFirstOutput(ctx, c)
			if err != nil {
				return fmt.Errorf("create: %w", err)
			}
			if i == 0 {
				run.Create, run.Answer = append(run.Create, d), append(run.Answer, answer)
			} else {
				run.CreateGW, run.AnswerGW = append(run.CreateGW, d), append(run.AnswerGW, answer)
			}
		}
	}
	r.log.Info("gateway: create done")

	// streams
	req := api.CreateRequest{Resources: api.Resources{MemoryBytes: streamMemory}}
	return r.withSandbox(ctx, req, func(id string) error {
		if err := r.exec(ctx, id, nil, "sh", "-c", fmt.Sprintf("head -c %d /dev/zero > /tmp/f", streamSize)); err != nil {
			return fmt.Errorf("writing the 1 GiB file: %w", err)
		}
		for _, c := range sides {
			if _, err := timedCat(ctx, c, id); err != nil {
				return err
			}
		}
		for range gatewayStreams {
			for i, c := range sides {
				r.idle(ctx)
				d, err := timedCat(ctx, c, id)
				if err != nil {
					return err
				}
				if i == 0 {
					run.Stream = append(run.Stream, d)
				} else {
					run.StreamGW = append(run.StreamGW, d)
				}
			}
		}
		return nil
	})
}

func timedExec(ctx context.Context, c *client.Client, id, cmd string) (time.Duration, error) {
	req := api.ExecRequest{Cmd: []string{cmd}}
	t0 := time.Now()
	st, err := c.Exec(ctx, id, req, client.ExecIO{})
	d := time.Since(t0)
	return d, execResult(req.Cmd, st, err, "")
}

// timedCat times `cat` of the stream file (streamSize bytes) in sandbox
// id through c, checking that every byte arrived.
func timedCat(ctx context.Context, c *client.Client, id string) (time.Duration, error) {
	cmd := []string{"cat", "/tmp/f"}
	cw := &countWriter{}
	t0 := time.Now()
	st, err := c.Exec(ctx, id, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: cw})
	d := time.Since(t0)
	if err := execResult(cmd, st, err, ""); err != nil {
		return 0, err
	}
	if cw.n != streamSize {
		return 0, fmt.Errorf("cat delivered %d bytes, want %d", cw.n, streamSize)
	}
	return d, nil
}

// createFirstOutput times Create and `echo hi` to its first byte through
// c (and the create's answer alone), then removes the sandbox untimed.
func (r *rig) createFirstOutput(ctx context.Context, c *client.Client) (first, answer time.Duration, _ error) {
	req := api.ExecRequest{Cmd: echoHi()}
	out := &firstWrite{}
	t0 := time.Now()
	sb, err := c.Create(ctx, api.CreateRequest{})
	answer = time.Since(t0)
	if err != nil {
		return 0, 0, err
	}
	r.track(sb.ID)
	st, err := c.Exec(ctx, sb.ID, req, client.ExecIO{Stdout: out})
	if err := errors.Join(execResult(req.Cmd, st, err, ""), wantOutput(toolSDK, out.buf.Bytes(), coldOutput)); err != nil {
		return 0, 0, errors.Join(err, r.remove(ctx, sb.ID))
	}
	return out.at.Sub(t0), answer, r.remove(ctx, sb.ID)
}

// gatewayProc is a running `paddock gateway`.
type gatewayProc struct {
	addr  string
	debug string // its --debug-socket, if it has one
	cmd   *exec.Cmd
	done  chan struct{}
}

func (r *rig) startGateway(ctx context.Context) (*gatewayProc, error) {
	token := filepath.Join(r.root, "token")
	return r.startGatewayWith(ctx, "--token-file", token, "--node-token-file", token, "--node", "bench="+gatewayTag+"@http://"+r.nodeAddr)
}

// startGatewayWith starts a gateway on a free loopback port with args.
func (r *rig) startGatewayWith(ctx context.Context, args ...string) (*gatewayProc, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(r.root, "gateway.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(r.opts.bin, append([]string{"gateway", "--listen", "tcp://" + addr}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &gatewayProc{addr: addr, cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(g.done) }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		conn, err := net.Dial("tcp", addr)
		if err == nil {
			conn.Close()
			return g, nil
		}
		select {
		case <-g.done:
			b, _ := os.ReadFile(filepath.Join(r.root, "gateway.log"))
			return nil, fmt.Errorf("gateway exited: %s", strings.TrimSpace(string(b)))
		case <-ctx.Done():
			g.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			g.stop()
			return nil, errors.New("gateway did not listen within 10 s")
		}
	}
}

// stop ends the gateway process it started (by its pid) and waits.
func (g *gatewayProc) stop() {
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.done:
	case <-time.After(10 * time.Second):
		g.cmd.Process.Kill()
		<-g.done
	}
}
