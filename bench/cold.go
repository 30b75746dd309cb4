package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	coldWarmup  = 3
	coldBarMax  = 25 * time.Millisecond
	coldOutput  = "hi\n"
	toolSDK     = "paddock (Go SDK)"
	toolCLI     = "paddock run (CLI)"
	toolBwrap   = "bwrap"
	toolRunc    = "runc run"
	noPeerValue = "n/a"
)

// echoHi is the command every tool runs.
func echoHi() []string { return []string{"echo", "hi"} }

// coldSample is one cold start of one tool.
type coldSample struct {
	First  time.Duration // start → first stdout byte
	Exit   time.Duration // start → the command (or the tool) has exited
	Create time.Duration // SDK only: Create returned
	Again  time.Duration // SDK only: a second echo hi in the same sandbox, outside the timed region
	Delete time.Duration // SDK only: Delete, outside the timed region
}

type coldTool struct {
	name string
	run  func(ctx context.Context) (coldSample, error)
}

func (r *rig) coldTools() []coldTool {
	tools := []coldTool{{toolSDK, r.coldSDK}, {toolCLI, r.coldCLI}}
	if r.bwrap != "" {
		tools = append(tools, coldTool{toolBwrap, r.coldBwrap})
	}
	if r.runc != nil {
		tools = append(tools, coldTool{toolRunc, r.coldRunc})
	}
	return tools
}

// firstWrite is an io.Writer that records when the first byte arrived.
type firstWrite struct {
	at  time.Time
	buf bytes.Buffer
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if f.at.IsZero() && len(p) > 0 {
		f.at = time.Now()
	}
	return f.buf.Write(p)
}

// coldSDK times Create until the first stdout byte of `echo hi` arrives
// through Exec. A second `echo hi` and Delete follow, each timed on its own.
func (r *rig) coldSDK(ctx context.Context) (coldSample, error) {
	req := api.ExecRequest{Cmd: echoHi()}
	out := &firstWrite{}
	t0 := time.Now()
	sb, err := r.client.Create(ctx, api.CreateRequest{})
	created := time.Since(t0)
	if err != nil {
		return coldSample{}, fmt.Errorf("creating sandbox: %w", err)
	}
	st, err := r.client.Exec(ctx, sb.ID, req, client.ExecIO{Stdout: out})
	exited := time.Since(t0)
	r.track(sb.ID)
	if err := errors.Join(execResult(req.Cmd, st, err, ""), wantOutput(toolSDK, out.buf.Bytes(), coldOutput)); err != nil {
		return coldSample{}, errors.Join(err, r.remove(ctx, sb.ID))
	}
	again, err := r.echoAgain(ctx, sb.ID)
	t1 := time.Now()
	rmErr := r.remove(ctx, sb.ID)
	deleted := time.Since(t1)
	if err := errors.Join(err, rmErr); err != nil {
		return coldSample{}, err
	}
	return coldSample{First: out.at.Sub(t0), Exit: exited, Create: created, Again: again, Delete: deleted}, nil
}

// echoAgain times a second `echo hi` in a sandbox to its first byte.
func (r *rig) echoAgain(ctx context.Context, id string) (time.Duration, error) {
	req := api.ExecRequest{Cmd: echoHi()}
	out := &firstWrite{}
	t0 := time.Now()
	st, err := r.client.Exec(ctx, id, req, client.ExecIO{Stdout: out})
	if err := errors.Join(execResult(req.Cmd, st, err, ""), wantOutput(toolSDK, out.buf.Bytes(), coldOutput)); err != nil {
		return 0, err
	}
	return out.at.Sub(t0), nil
}

func (r *rig) coldCLI(ctx context.Context) (coldSample, error) {
	argv := append([]string{r.opts.bin, "--host", r.daemon.host, "run", "--"}, echoHi()...)
	return coldProcess(ctx, toolCLI, argv)
}

func (r *rig) coldBwrap(ctx context.Context) (coldSample, error) {
	return coldProcess(ctx, toolBwrap, bwrapArgv(r.bwrap, echoHi()...))
}

// coldRunc runs `runc run` on a freshly written bundle (written before the
// clock starts) and makes sure the container is gone afterwards.
func (r *rig) coldRunc(ctx context.Context) (coldSample, error) {
	id := r.runc.newID("cold")
	dir, err := r.runc.bundle(id, echoHi())
	if err != nil {
		return coldSample{}, err
	}
	s, err := coldProcess(ctx, toolRunc, r.runc.argv("run", "--bundle", dir, id))
	return s, errors.Join(err, r.runc.remove(ctx, id))
}

func coldProcess(ctx context.Context, tool string, argv []string) (coldSample, error) {
	t, err := timeProcess(ctx, argv)
	if err == nil {
		err = wantOutput(tool, t.Stdout, coldOutput)
	}
	return coldSample{First: t.First, Exit: t.Exit}, err
}

// benchCold interleaves the tools, rotating their order every round, so
// that drift in the machine's load falls on all of them alike; before each
// sample it waits for the daemon to be idle.
func benchCold(ctx context.Context, r *rig) *section {
	s := &section{Method: coldMethod(r.opts.n)}
	tools := r.coldTools()
	samples := make(map[string][]coldSample, len(tools))
	rounds := coldWarmup + r.opts.n
rounds:
	for i := 0; i < rounds; i++ {
		for j := range tools {
			t := tools[(i+j)%len(tools)]
			r.idle(ctx)
			cs, err := t.run(ctx)
			if err != nil {
				s.Err = fmt.Errorf("%s, round %d: %w", t.name, i+1, err)
				break rounds
			}
			if i >= coldWarmup {
				samples[t.name] = append(samples[t.name], cs)
			}
		}
		if (i+1)%10 == 0 {
			r.log.Info("cold create", "round", i+1, "of", rounds)
		}
	}
	coldTables(s, tools, samples)
	s.Bars = coldBars(samples)
	return s
}

func coldMethod(n int) []string {
	return []string{
		fmt.Sprintf("%d timed rounds after %d warm-up rounds; each round runs every tool once, in an order that rotates every round. "+
			"Before each sample the harness waits until the daemon is idle (it and its child processes used < 0.2 ms CPU over 10 ms "+
			"and it runs no helper such as mkfs), so that its background work (refilling the disk pool, starting warm guests) does not land "+
			"in the next tool's timed region. Creates therefore find the daemon's pools refilled; back-to-back creates are in the density table.", n, coldWarmup),
		"**paddock (Go SDK)**: the clock starts before `client.Create` (default `host` image, default limits) and stops when " +
			"the first stdout byte of `Exec(echo hi)` reaches the SDK's stdout writer. A second `echo hi` in the same sandbox and `Delete` run after the clock stops. " +
			"The SDK keeps its HTTP connection to the daemon alive between rounds, as a harness would.",
		"**paddock run (CLI)**: `paddock --host … run -- echo hi` as a child process; the clock starts before fork/exec " +
			"and stops when the first byte reaches the harness through a pipe (the \"first output\" column). " +
			"The exit column is the whole process, which also deletes the sandbox.",
		"**bwrap**: `bwrap --clearenv --setenv PATH … --setenv LANG C.UTF-8 --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin` (and lib, lib64, sbin) " +
			"`--proc /proc --dev /dev --tmpfs /tmp -- echo hi`, timed like the CLI.",
		"**runc run**: `runc --root <private> run --bundle <dir> <unique id>` on a bundle from `runc spec` edited to: rootfs = " +
			"a directory with the host's /usr bind-mounted read-only and bin, lib, lib64, sbin symlinks, read-only root, tmpfs /tmp, " +
			"`terminal: false`, namespaces pid, network, ipc, uts, mount and cgroup (no user namespace), args `echo hi`, env PATH and LANG=C.UTF-8. " +
			"config.json is written before the clock starts; the container is checked gone (and deleted if not) after it stops.",
		"Every tool's `echo` runs with the environment the host image gives a sandbox's process (PATH, LANG=C.UTF-8), whatever the bench's own. " +
			"Every tool's output is checked to be exactly `hi\\n`. Ratios are this row's median ÷ the peer's median: below 1 is faster.",
	}
}

func coldTables(s *section, tools []coldTool, samples map[string][]coldSample) {
	first := func(name string) summary {
		return summarize(coldField(samples[name], func(c coldSample) time.Duration { return c.First }))
	}
	bwrap, runc := first(toolBwrap), first(toolRunc)
	t := table{Header: []string{"tool", "n", "first output median", "p90", "÷ bwrap", "÷ runc", "exit median", "exit p90"}}
	for _, tool := range tools {
		cs := samples[tool.name]
		if len(cs) == 0 {
			continue
		}
		f := first(tool.name)
		e := summarize(coldField(cs, func(c coldSample) time.Duration { return c.Exit }))
		t.add(tool.name, fmt.Sprint(f.N), ms(f.Median), ms(f.P90), ratio(f.Median, bwrap.Median), ratio(f.Median, runc.Median), ms(e.Median), ms(e.P90))
	}
	s.Tables = append(s.Tables, t)

	sdk := samples[toolSDK]
	if len(sdk) == 0 {
		return
	}
	b := table{Caption: "Where the Go SDK's time goes (same samples):", Header: []string{"phase (from the call to Create)", "median", "p90"}}
	for _, p := range []struct {
		name string
		f    func(coldSample) time.Duration
	}{
		{"Create returned (sandbox running)", func(c coldSample) time.Duration { return c.Create }},
		{"first stdout byte of echo hi", func(c coldSample) time.Duration { return c.First }},
		{"Exec returned (exit status received)", func(c coldSample) time.Duration { return c.Exit }},
		{"for comparison: a second `echo hi` in the same sandbox, call → first byte", func(c coldSample) time.Duration { return c.Again }},
		{"Delete (its own duration, not timed above)", func(c coldSample) time.Duration { return c.Delete }},
	} {
		sm := summarize(coldField(sdk, p.f))
		b.add(p.name, ms(sm.Median), ms(sm.P90))
	}
	s.Tables = append(s.Tables, b)
}

func coldField(cs []coldSample, f func(coldSample) time.Duration) []time.Duration {
	out := make([]time.Duration, len(cs))
	for i, c := range cs {
		out[i] = f(c)
	}
	return out
}

func coldBars(samples map[string][]coldSample) []bar {
	firsts := func(name string) []time.Duration {
		return coldField(samples[name], func(c coldSample) time.Duration { return c.First })
	}
	sdk, bwrap := firsts(toolSDK), firsts(toolBwrap)
	b1 := bar{Issue: 2, What: "cold create → first output of `echo hi`, median (Go SDK)", Target: "≤ 25 ms", Value: noPeerValue, Verdict: notMeasured}
	b2 := bar{Issue: 2, What: "cold create → first output, median, vs bwrap", Target: "below bwrap's median", Value: noPeerValue, Verdict: notMeasured}
	if len(sdk) > 0 {
		m := summarize(sdk).Median
		b1.Value, b1.Verdict = ms(m), check(m <= coldBarMax)
		if len(bwrap) > 0 {
			bm := summarize(bwrap).Median
			b2.Value = fmt.Sprintf("%s vs bwrap %s (%s)", ms(m), ms(bm), ratio(m, bm))
			b2.Verdict = check(m < bm)
		}
	}
	return []bar{b1, b2}
}
