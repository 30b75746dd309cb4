package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// gvisorPool is the size of the bench daemon's pool of ready gvisor
// sandboxes (--gvisor-pool), and gvisorRounds caps the timed rounds: a
// sandbox built without the pool takes seconds on a loaded machine.
const (
	gvisorPool    = 2
	gvisorRounds  = 10
	gvisorBarMax  = 50 * time.Millisecond
	gvisorPoolKey = "gvisor:image:host"
	// gvisorColdDisk is a disk size no pooled sandbox has (they have the
	// default's), so that a create asking for it builds its sandbox.
	gvisorColdDisk = 2 << 30
)

// gvisorArgs are the bench daemon's flags for the gvisor runtime: runsc
// from PADDOCK_RUNSC (make bench builds it and sets it), and the pool.
func gvisorArgs() []string {
	runsc := os.Getenv("PADDOCK_RUNSC")
	if runsc == "" {
		return nil
	}
	return []string{"--runsc", runsc, "--gvisor-pool", fmt.Sprint(gvisorPool)}
}

// benchGvisor times a gvisor create → first output of `echo hi` through
// the pool and without it, beside a bare `runsc run` of a bundle running
// `echo hi` (issue 23, bar 1).
func benchGvisor(ctx context.Context, r *rig) *section {
	s := &section{}
	runsc := os.Getenv("PADDOCK_RUNSC")
	if runsc == "" {
		s.Skip = "PADDOCK_RUNSC is not set (make bench builds runsc and sets it)"
		return s
	}
	n := min(r.opts.n, gvisorRounds)
	s.Method = []string{
		fmt.Sprintf("%d timed rounds after one warm-up round; each round runs the three once, in this order. The daemon keeps %d gvisor sandboxes ready (`--gvisor-pool %d`); before each pooled sample the harness waits until the pool is full and the daemon idle.", n, gvisorPool, gvisorPool),
		"**pool**: the clock starts before `client.Create(runtime: gvisor)` (default image, limits and disk: a pooled sandbox serves it) and stops when the first stdout byte of `Exec(echo hi)` reaches the SDK. Delete runs after.",
		"**no pool**: the same with a 2 GiB disk, which no pooled sandbox has (theirs is the default size): the create builds one (a disk, the root overlay, `runsc run`, the guest's Prepare and Activate).",
		"**runsc run (bare)**: `runsc --root <private> --platform systrap --network none run --bundle <dir> <id>` on the runc section's bundle (the host's /usr read-only), args `echo hi`, timed like the CLI rows of the cold section.",
	}
	var pooled, cold, bare []time.Duration
	var bundles *runcRig
	if r.runc != nil {
		bundles = r.runc
	} else {
		s.note("runc is not installed: no bundle for the bare runsc row")
	}
	stateRoot := filepath.Join(r.root, "runsc-bench")
	for i := 0; i < n+1; i++ {
		if err := r.waitPool(ctx, gvisorPoolKey, gvisorPool); err != nil {
			s.Err = err
			break
		}
		d, err := r.gvisorCreate(ctx, api.Resources{})
		if err != nil {
			s.Err = fmt.Errorf("pooled create, round %d: %w", i+1, err)
			break
		}
		r.idle(ctx)
		dc, err := r.gvisorCreate(ctx, api.Resources{DiskBytes: gvisorColdDisk})
		if err != nil {
			s.Err = fmt.Errorf("create without the pool, round %d: %w", i+1, err)
			break
		}
		var db time.Duration
		if bundles != nil {
			r.idle(ctx)
			id := bundles.newID("runsc")
			dir, err := bundles.bundle(id, echoHi())
			if err != nil {
				s.Err = err
				break
			}
			cs, err := coldProcess(ctx, "runsc run", []string{runsc, "--root", stateRoot, "--platform", "systrap", "--network", "none", "run", "--bundle", dir, id})
			output(ctx, runsc, "--root", stateRoot, "delete", "--force", id)
			os.RemoveAll(dir)
			if err != nil {
				s.Err = fmt.Errorf("runsc run, round %d: %w", i+1, err)
				break
			}
			db = cs.First
		}
		if i == 0 {
			continue // warm-up
		}
		pooled, cold = append(pooled, d), append(cold, dc)
		if bundles != nil {
			bare = append(bare, db)
		}
	}
	// runsc pins an empty network namespace under its root for its
	// gofers; it goes with the root.
	for unix.Unmount(filepath.Join(stateRoot, "null-netns"), unix.MNT_DETACH) == nil {
	}
	t := table{Header: []string{"gvisor create → first output", "n", "median", "p90", "min", "max"}}
	for _, row := range []struct {
		name string
		d    []time.Duration
	}{{"pool", pooled}, {"no pool", cold}, {"runsc run (bare)", bare}} {
		if len(row.d) == 0 {
			continue
		}
		sm := summarize(row.d)
		t.Rows = append(t.Rows, []string{row.name, fmt.Sprint(sm.N), ms(sm.Median), ms(sm.P90), ms(sm.Min), ms(sm.Max)})
	}
	s.Tables = append(s.Tables, t)
	if len(pooled) > 0 {
		med := summarize(pooled).Median
		s.Bars = append(s.Bars, bar{Issue: 23, What: "gvisor create → first output of `echo hi`, through a pool (median)",
			Target: "≤ " + ms(gvisorBarMax), Value: ms(med), Verdict: check(med <= gvisorBarMax)})
	}
	if s.Err == nil {
		r.benchMemoryPause(ctx, s)
	}
	return s
}

// gvisorCreate times one gvisor create → first output of `echo hi`, then
// deletes the sandbox outside the timed region.
func (r *rig) gvisorCreate(ctx context.Context, res api.Resources) (time.Duration, error) {
	out := &firstWrite{}
	req := api.ExecRequest{Cmd: echoHi()}
	t0 := time.Now()
	sb, err := r.client.Create(ctx, api.CreateRequest{Runtime: "gvisor", Resources: res})
	if err != nil {
		return 0, err
	}
	r.track(sb.ID)
	st, err := r.client.Exec(ctx, sb.ID, req, client.ExecIO{Stdout: out})
	if err := errors.Join(execResult(req.Cmd, st, err, ""), wantOutput("gvisor", out.buf.Bytes(), coldOutput)); err != nil {
		return 0, err
	}
	d := out.at.Sub(t0)
	return d, r.remove(ctx, sb.ID)
}
