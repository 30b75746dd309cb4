package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/internal/network"
	"github.com/paddock-dev/paddock/internal/rundir"
	"github.com/paddock-dev/paddock/internal/storage/disk"
)

// The baseline comparison: the same work against this build's daemon and a
// second daemon started from -baseline (the previous main, say), in
// alternating blocks, so that a change is judged within one run and one
// minute of the machine rather than across runs whose floor moves.
const (
	baselineBlocks = 6
	baselineExecs  = 100 // exec round trips of `true` per daemon and block
	// create → first output per daemon and block. Eight were too few:
	// their median moved by ±10% between runs of one binary against
	// itself (A/A runs, 2026-12-06).
	baselineColds = 24
	// streamed `head -c` of baselineStreamMiB per daemon and block: a
	// single stream's rate ranged from 750 to 1440 MB/s within one A/A
	// run, and the median of six was 10-16% off.
	baselineStreams   = 4
	baselineStreamMiB = 256
	// baselineNoise is how much slower than the baseline a median may be
	// before the bar calls it a regression rather than noise.
	baselineNoise = 0.10
)

// baselineDaemon is the second daemon of a -baseline run. It lives under
// the rig's root, so the rig's final sweep finds its mounts and loops.
type baselineDaemon struct {
	*daemon
	root    string
	cgroup  string
	netName string
	served  bool
}

// startBaseline starts the baseline daemon beside the rig's own: its own
// directories, cgroup parent, uid window and network.
func (r *rig) startBaseline(ctx context.Context) error {
	pid := os.Getpid()
	b := &baselineDaemon{
		root:    filepath.Join(r.root, "baseline"),
		cgroup:  r.cgroupParent + "-base",
		netName: fmt.Sprintf("pq%05x", pid&0xfffff),
	}
	if err := os.Mkdir(b.root, 0o711); err != nil {
		return fmt.Errorf("making the baseline's dir: %w", err)
	}
	uidStart := uint32(1<<30 + ((pid+4)%8)<<27)
	d, err := newDaemon(r.opts.baseline, b.root, b.cgroup, uidStart,
		"--network-name", b.netName, "--network-subnet", freeSubnet(pid+8))
	if err != nil {
		return err
	}
	d.args = knownFlags(r.opts.baseline, d.args)
	b.daemon = d
	r.baseline = b
	r.log.Info("starting baseline daemon", "bin", r.opts.baseline, "dir", b.root)
	if err := d.start(ctx); err != nil {
		return fmt.Errorf("starting the baseline daemon: %w", err)
	}
	b.served = true
	return nil
}

// closeBaseline removes the baseline daemon's sandboxes, stops it and
// removes its storage mount and network; its cgroup parent is swept with
// the rig's.
func (r *rig) closeBaseline(ctx context.Context, rep *cleanupReport) {
	b := r.baseline
	if b == nil {
		return
	}
	rep.CgroupNames = append(rep.CgroupNames, b.cgroup)
	if !b.served {
		return
	}
	if b.running() {
		list, err := b.client.List(ctx, client.ListOptions{})
		if err != nil {
			rep.problem("listing the baseline's sandboxes: %v", err)
		}
		for _, sb := range list {
			if err := b.client.Delete(ctx, sb.ID, true); err != nil && !client.IsNotFound(err) {
				rep.problem("removing baseline sandbox %s: %v", sb.ID, err)
			}
		}
		if err := b.stop(); err != nil {
			rep.problem("stopping the baseline daemon: %v", err)
		}
	}
	if err := disk.Unmount(filepath.Join(b.root, "state", "storage")); err != nil {
		rep.problem("unmounting the baseline's storage: %v", err)
	}
	if err := rundir.Unmount(filepath.Join(b.root, "run")); err != nil {
		rep.problem("unmounting the baseline's run dir: %v", err)
	}
	if err := network.Uninstall(b.netName); err != nil {
		rep.problem("removing the baseline's network %s: %v", b.netName, err)
	}
}

// baselineSide is one daemon's samples in the comparison.
type baselineSide struct {
	name   string
	client *client.Client
	pid    func() int
	sbID   string // the sandbox the exec and stream samples run in
	execs  []time.Duration
	colds  []time.Duration
	mbps   []float64
	blocks []time.Duration // each block's exec median
}

func benchBaseline(ctx context.Context, r *rig) *section {
	s := &section{Method: []string{
		fmt.Sprintf("This build's daemon and a daemon started from `-baseline` (%s) run side by side, each with its own directories, cgroup parent, uid window and network.", r.opts.baseline),
		fmt.Sprintf("%d blocks; in each, both daemons in turn (the order alternates by block): %d exec round trips of `true` in a kept sandbox, %d creates to the first byte of `echo hi` (each sandbox removed after), and %d `head -c %d MiB` streamed through exec. Medians are of all blocks' samples.", baselineBlocks, baselineExecs, baselineColds, baselineStreams, baselineStreamMiB),
		"The Go SDK of this build drives both daemons, so the comparison is of the daemon and the guest.",
	}}
	if r.opts.baseline == "" {
		s.Skip = "no -baseline binary given (`make bench BASE=<rev>` builds one)"
		return s
	}
	if err := r.startBaseline(ctx); err != nil {
		s.Err = err
		return s
	}
	cur := &baselineSide{name: "this build", client: r.client, pid: r.daemon.pid}
	base := &baselineSide{name: "baseline", client: r.baseline.client, pid: r.baseline.pid}
	sides := []*baselineSide{cur, base}
	defer func() {
		for _, sd := range sides {
			if sd.sbID != "" {
				dctx, cancel := context.WithTimeout(context.Background(), opTimeout)
				sd.client.Delete(dctx, sd.sbID, true)
				cancel()
			}
		}
	}()
	for _, sd := range sides {
		sb, err := sd.client.Create(ctx, api.CreateRequest{})
		if err != nil {
			s.Err = fmt.Errorf("%s: creating the exec sandbox: %w", sd.name, err)
			return s
		}
		sd.sbID = sb.ID
		if _, err := sd.exec(ctx, "true"); err != nil { // warm-up
			s.Err = fmt.Errorf("%s: %w", sd.name, err)
			return s
		}
	}
	for blk := range baselineBlocks {
		order := sides
		if blk%2 == 1 {
			order = []*baselineSide{base, cur}
		}
		for _, sd := range order {
			if err := sd.block(ctx); err != nil {
				s.Err = fmt.Errorf("%s, block %d: %w", sd.name, blk+1, err)
				return s
			}
		}
		r.log.Info("baseline block", "block", blk+1, "this", ms(cur.blocks[blk]), "baseline", ms(base.blocks[blk]))
	}
	baselineTables(s, cur, base)
	s.Bars = baselineBars(cur, base)
	return s
}

// block takes one block's samples from one daemon.
func (sd *baselineSide) block(ctx context.Context) error {
	waitIdle(ctx, sd.pid())
	var blk []time.Duration
	for range baselineExecs {
		d, err := sd.exec(ctx, "true")
		if err != nil {
			return err
		}
		blk = append(blk, d)
	}
	sd.execs = append(sd.execs, blk...)
	sd.blocks = append(sd.blocks, summarize(blk).Median)
	for range baselineColds {
		d, err := sd.cold(ctx)
		if err != nil {
			return err
		}
		sd.colds = append(sd.colds, d)
	}
	for range baselineStreams {
		rate, err := sd.stream(ctx)
		if err != nil {
			return err
		}
		sd.mbps = append(sd.mbps, rate)
	}
	return nil
}

func (sd *baselineSide) exec(ctx context.Context, cmd ...string) (time.Duration, error) {
	t0 := time.Now()
	st, err := sd.client.Exec(ctx, sd.sbID, api.ExecRequest{Cmd: cmd}, client.ExecIO{})
	d := time.Since(t0)
	return d, execResult(cmd, st, err, "")
}

// cold times a create to the first byte of `echo hi`, then removes the
// sandbox (untimed).
func (sd *baselineSide) cold(ctx context.Context) (time.Duration, error) {
	out := &firstWrite{}
	t0 := time.Now()
	sb, err := sd.client.Create(ctx, api.CreateRequest{})
	if err != nil {
		return 0, fmt.Errorf("creating sandbox: %w", err)
	}
	st, err := sd.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: echoHi()}, client.ExecIO{Stdout: out})
	rmErr := sd.client.Delete(ctx, sb.ID, true)
	if err := errors.Join(execResult(echoHi(), st, err, ""), wantOutput(toolSDK, out.buf.Bytes(), coldOutput), rmErr); err != nil {
		return 0, err
	}
	return out.at.Sub(t0), nil
}

// stream times `head -c` of baselineStreamMiB through exec, in MB/s.
func (sd *baselineSide) stream(ctx context.Context) (float64, error) {
	n := int64(baselineStreamMiB) << 20
	cmd := []string{"head", "-c", fmt.Sprint(n), "/dev/zero"}
	var cw countWriter
	t0 := time.Now()
	st, err := sd.client.Exec(ctx, sd.sbID, api.ExecRequest{Cmd: cmd}, client.ExecIO{Stdout: &cw})
	d := time.Since(t0)
	if err := execResult(cmd, st, err, ""); err != nil {
		return 0, err
	}
	if cw.n != n {
		return 0, fmt.Errorf("streamed %d bytes, want %d", cw.n, n)
	}
	return mbps(n, d), nil
}

func baselineTables(s *section, cur, base *baselineSide) {
	t := table{Header: []string{"what", "this build", "baseline", "this ÷ baseline"}}
	for _, row := range []struct {
		what string
		a, b []time.Duration
	}{
		{"exec round trip of `true`, median", cur.execs, base.execs},
		{"exec round trip of `true`, p99", nil, nil},
		{"create → first output of `echo hi`, median", cur.colds, base.colds},
	} {
		if row.a == nil {
			a, b := summarize(cur.execs).P99, summarize(base.execs).P99
			t.add(row.what, ms(a), ms(b), ratio(a, b))
			continue
		}
		a, b := summarize(row.a).Median, summarize(row.b).Median
		t.add(row.what, ms(a), ms(b), ratio(a, b))
	}
	ra, rb := medianFloat(cur.mbps), medianFloat(base.mbps)
	t.add(fmt.Sprintf("streaming %d MiB through exec, median", baselineStreamMiB),
		fmt.Sprintf("%.0f MB/s", ra), fmt.Sprintf("%.0f MB/s", rb), fmt.Sprintf("%.2f×", ra/rb))
	s.Tables = append(s.Tables, t)

	blocks := table{Caption: "exec round trip of `true`, median of each block", Header: []string{"block", "this build", "baseline", "difference"}}
	for i := range cur.blocks {
		blocks.add(fmt.Sprint(i+1), ms(cur.blocks[i]), ms(base.blocks[i]), ms(cur.blocks[i]-base.blocks[i]))
	}
	s.Tables = append(s.Tables, blocks)
}

func baselineBars(cur, base *baselineSide) []bar {
	within := func(a, b time.Duration) bool { return float64(a) <= float64(b)*(1+baselineNoise) }
	ea, eb := summarize(cur.execs).Median, summarize(base.execs).Median
	ca, cb := summarize(cur.colds).Median, summarize(base.colds).Median
	ra, rb := medianFloat(cur.mbps), medianFloat(base.mbps)
	target := fmt.Sprintf("within %.0f%% of the baseline", baselineNoise*100)
	return []bar{
		{Issue: 19, What: "exec round trip of `true`, median, against the baseline", Target: target,
			Value: fmt.Sprintf("%s vs %s (%s)", ms(ea), ms(eb), ratio(ea, eb)), Verdict: check(within(ea, eb))},
		{Issue: 19, What: "create → first output, median, against the baseline", Target: target,
			Value: fmt.Sprintf("%s vs %s (%s)", ms(ca), ms(cb), ratio(ca, cb)), Verdict: check(within(ca, cb))},
		{Issue: 19, What: "streaming through exec, median, against the baseline", Target: target,
			Value: fmt.Sprintf("%.0f vs %.0f MB/s", ra, rb), Verdict: check(ra >= rb*(1-baselineNoise))},
	}
}

// knownFlags drops from args the flags (each with its value) that bin's
// `serve` does not know: a baseline from before a flag of the rig's (say
// --disk-overcommit) would refuse to start otherwise. Its help lists them.
func knownFlags(bin string, args []string) []string {
	help, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	out := args[:1:1] // "serve"
	for i := 1; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "--") && !bytes.Contains(help, []byte(a+" ")) {
			if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
				i++
			}
			continue
		}
		out = append(out, a)
	}
	return out
}
