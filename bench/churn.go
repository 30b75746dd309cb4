package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	paddockd "github.com/paddock-dev/paddock/internal/daemon"
)

// churnClients is how many loops run at once (issue 21's bar).
const churnClients = 8

// churnResult is one churn loop's outcome: completed cycles, errors and
// the duration of each cycle.
type churnResult struct {
	Cycles  []time.Duration
	Errors  int
	FirstEr string
	Took    time.Duration
}

func (c *churnResult) rate() float64 {
	if c.Took <= 0 {
		return 0
	}
	return float64(len(c.Cycles)) / c.Took.Seconds()
}

// churn runs n concurrent loops of cycle for d and collects every cycle's
// duration and the errors.
func churn(ctx context.Context, n int, d time.Duration, cycle func(ctx context.Context) error) *churnResult {
	var (
		mu  sync.Mutex
		res churnResult
		wg  sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	end := t0.Add(d)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) && ctx.Err() == nil {
				t1 := time.Now()
				err := cycle(ctx)
				took := time.Since(t1)
				mu.Lock()
				if err != nil {
					res.Errors++
					if res.FirstEr == "" {
						res.FirstEr = err.Error()
					}
				} else {
					res.Cycles = append(res.Cycles, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Took = time.Since(t0)
	return &res
}

// sandboxCycle is create → exec `echo hi` → delete through the Go SDK.
func (r *rig) sandboxCycle(req api.CreateRequest) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		sb, err := r.client.Create(ctx, req)
		if err != nil {
			return fmt.Errorf("create: %w", err)
		}
		r.track(sb.ID)
		var out strings.Builder
		st, err := r.client.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"echo", "hi"}}, client.ExecIO{Stdout: &out})
		eerr := execResult([]string{"echo", "hi"}, st, err, "")
		if eerr == nil && out.String() != "hi\n" {
			eerr = fmt.Errorf("echo hi printed %q", out.String())
		}
		return errors.Join(eerr, r.remove(ctx, sb.ID))
	}
}

// churnTime is how long each churn loop runs (issue 21: 60 s); -churn-time
// shortens it for development.
var churnTime = 60 * time.Second

// peerChurnTime is how long bwrap's and runc's loops run: their rates
// are steady within seconds, and two more minutes of them would make
// `make bench` that much longer.
func peerChurnTime() time.Duration { return min(churnTime, 20*time.Second) }

// churnProfile, if set, is where the daemon's CPU profile over the
// default-image churn loop goes (its mutex and block profiles to
// churnProfile+".mutex" and ".block").
var churnProfile string

// churnTemplate is the template of the churn loop that starts from one.
const (
	churnTemplate = "bench-churn"
	churnWarm     = 8
	churnBarRate  = 200.0
)

func churnMethod() []string {
	return []string{
		fmt.Sprintf("%d clients at once, each looping for %s: `Create` (default image and limits) → `Exec(echo hi)` (output checked to be `hi\\n`) → `Delete` with force, through the Go SDK, one client object shared (its connections kept alive). The rate is completed cycles ÷ wall time; an error is any failed call or wrong output. The cycle's percentiles are of whole cycles.", churnClients, churnTime),
		fmt.Sprintf("**From a template**: the same loop with `Create({from: %q})`, a template with `warm: %d`.", churnTemplate, churnWarm),
		fmt.Sprintf("Each paddock loop starts with its pool full (`%s`, or the template's) and the daemon idle; the template is removed after its loop, and the peers start once the default pool is full again, so that no refill runs during their loops.", defaultPool),
		fmt.Sprintf("**bwrap** and **runc run**: the same number of loops, for %s (their rates are steady within seconds), each spawning the tool with `echo hi` "+
			"(flags and bundle as in the cold table) and reaping it; runc's container is checked gone after each run.", peerChurnTime()),
		fmt.Sprintf("**A pooled guest's own cost**, after the peers: the default pool is given %d more guests while nothing else runs, and each guest the pool made then is read once it is prepared and idle: its threads' run time (`/proc/PID/task/*/schedstat`) and context switches. It moves between runs of one build too (17.1-22.0 ms medians in six runs on a slow day of this host), but reads a change to the guest apart from the rest of a cycle; its context switches move less.", guestSamples),
	}
}

// benchChurn runs the churn loops of paddock and its peers.
func benchChurn(ctx context.Context, r *rig) *section {
	s := &section{Method: churnMethod()}
	t := table{Header: []string{"loop", "cycles", "rate", "errors", "cycle p50", "p90", "p99", "max"}}
	row := func(name string, c *churnResult) {
		sm := summarize(c.Cycles)
		t.add(name, fmt.Sprint(len(c.Cycles)), fmt.Sprintf("%.1f/s", c.rate()), fmt.Sprint(c.Errors), ms(sm.Median), ms(sm.P90), ms(sm.P99), ms(sm.Max))
		if c.FirstEr != "" {
			s.note("%s: first error: %s", name, truncate(c.FirstEr, 300))
		}
	}
	b1 := bar{Issue: 21, What: fmt.Sprintf("sustained churn, %d clients × create → exec echo hi → delete, default image", churnClients), Target: "≥ 200/s, 0 errors, p99 reported", Value: noPeerValue, Verdict: notMeasured}
	b2 := bar{Issue: 21, What: fmt.Sprintf("sustained churn from a template with a warm pool, %d clients", churnClients), Target: "≥ 200/s, 0 errors, p99 reported", Value: noPeerValue, Verdict: notMeasured}
	b3 := bar{Issue: 21, What: "the same churn loop (spawn → echo hi → exit), bwrap and runc, as rates", Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	defer func() {
		s.Tables = append(s.Tables, t)
		s.Bars = []bar{b1, b2, b3}
	}()
	churnBar := func(b *bar, c *churnResult) {
		sm := summarize(c.Cycles)
		b.Value = fmt.Sprintf("%.1f/s, %d errors, p99 %s", c.rate(), c.Errors, ms(sm.P99))
		b.Verdict = check(c.rate() >= churnBarRate && c.Errors == 0)
	}

	if err := r.waitFullPool(ctx, defaultPool); err != nil {
		s.Err = err
		return s
	}
	var profiled chan error
	if churnProfile != "" {
		profiled = make(chan error, 1)
		go func() { profiled <- r.profileChurn(ctx) }()
	}
	c := r.meteredChurn(ctx, s, "paddock, default image", r.sandboxCycle(api.CreateRequest{}))
	if profiled != nil {
		if err := <-profiled; err != nil {
			s.note("profiling the churn loop: %v", err)
		}
	}
	row("paddock, default image", c)
	churnBar(&b1, c)
	if ctx.Err() != nil {
		s.Err = ctx.Err()
		return s
	}

	c, err := r.templateChurn(ctx, s)
	if c != nil {
		row(fmt.Sprintf("paddock, template with warm: %d", churnWarm), c)
		churnBar(&b2, c)
	}
	if err != nil {
		s.Err = err
		return s
	}

	// The peers' loops start once the daemon has refilled its pools, so
	// that its background work does not land in their numbers.
	if err := r.waitFullPool(ctx, defaultPool); err != nil {
		s.Err = err
		return s
	}
	var peers []string
	if r.bwrap != "" {
		c = meteredPeer(s, "bwrap", func() *churnResult {
			return churn(ctx, churnClients, peerChurnTime(), func(ctx context.Context) error {
				_, err := coldProcess(ctx, toolBwrap, bwrapArgv(r.bwrap, echoHi()...))
				return err
			})
		})
		row("bwrap", c)
		peers = append(peers, fmt.Sprintf("bwrap %.1f/s", c.rate()))
		r.idle(ctx)
	}
	if r.runc != nil {
		c = meteredPeer(s, "runc run", func() *churnResult {
			return churn(ctx, churnClients, peerChurnTime(), func(ctx context.Context) error {
				_, err := r.coldRunc(ctx)
				return err
			})
		})
		row("runc run", c)
		peers = append(peers, fmt.Sprintf("runc %.1f/s", c.rate()))
	}
	if len(peers) > 0 {
		b3.Value, b3.Verdict = strings.Join(peers, ", "), reported
	}
	if note, err := r.guestCost(ctx); err != nil {
		s.note("a pooled guest's cost: %v", err)
	} else {
		s.note("%s", note)
	}
	return s
}

// guestSamples is how many guests guestCost makes and reads.
const guestSamples = 16

// guestCost has the default pool make guestSamples more guests while
// the host is otherwise idle and says what each cost, read on the guests
// themselves: their threads' run time (schedstat) and context switches,
// from the fork to prepared and idle in the pool. A change to the guest
// moves a churn cycle by a few per cent, which the runs' noise on a
// shared host hides; this reads the guest apart from the rest.
func (r *rig) guestCost(ctx context.Context) (string, error) {
	r.idle(ctx)
	p, err := r.client.Pools(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the pools: %w", err)
	}
	since, err := uptimeTicks()
	if err != nil {
		return "", err
	}
	restore, err := r.sizePool(ctx, defaultPool, p.Target[defaultPool]+guestSamples)
	if err != nil {
		return "", err
	}
	defer func() {
		if err := restore(); err != nil {
			r.log.Warn("restoring the default pool", "err", err)
		}
		r.idle(ctx)
	}()
	if err := r.waitFullPool(ctx, defaultPool); err != nil {
		return "", err
	}
	var cpu []time.Duration
	var switches []int
	for _, f := range childrenOf(r.daemon.pid()) {
		for _, g := range childrenOf(f.PID) {
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", g.PID))
			if !strings.HasPrefix(exe, "/memfd:") || g.State == 'Z' || g.Start < since {
				continue
			}
			c, err := threadsCPU(g.PID)
			if err != nil {
				continue // gone meanwhile
			}
			n, err := threadSwitches(g.PID)
			if err != nil {
				continue
			}
			cpu, switches = append(cpu, c), append(switches, n)
		}
	}
	if len(cpu) == 0 {
		return "", errors.New("no guest the pool made was found under the daemon's forkers")
	}
	slices.Sort(switches)
	sm := summarize(cpu)
	return fmt.Sprintf("A pooled guest's own cost (after the loops, the default pool given %d more guests on an otherwise idle host; %d read, prepared and idle): CPU from its fork to ready, its threads' run time, median %s (min %s, max %s); context switches median %d.",
		guestSamples, len(cpu), ms(sm.Median), ms(sm.Min), ms(sm.Max), switches[len(switches)/2]), nil
}

// templateChurn builds the churn template, waits for its pool, runs the
// churn loop from it and removes the template, so that its pool does not
// refill while the peers run.
func (r *rig) templateChurn(ctx context.Context, s *section) (_ *churnResult, retErr error) {
	spec := tplSpec(churnWarm)
	spec.Name = churnTemplate
	if _, err := r.client.BuildTemplate(ctx, spec, nil); err != nil {
		return nil, fmt.Errorf("building the churn template: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := r.client.DeleteTemplate(dctx, churnTemplate); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("removing the churn template: %w", err))
		}
	}()
	if err := r.waitPool(ctx, "template:"+churnTemplate, churnWarm); err != nil {
		return nil, err
	}
	c := r.meteredChurn(ctx, s, fmt.Sprintf("paddock, template with warm: %d", churnWarm), r.sandboxCycle(api.CreateRequest{From: churnTemplate}))
	return c, ctx.Err()
}

// profileChurn takes the daemon's CPU profile over the churn loop (all
// but its first and last half second), then its mutex and block
// profiles (who holds a lock others wait on, and who waits).
func (r *rig) profileChurn(ctx context.Context) error {
	sock := filepath.Join(r.root, "run", paddockd.DebugSocket)
	d := max(churnTime-time.Second, time.Second)
	time.Sleep(500 * time.Millisecond)
	if err := saveProfile(ctx, sock, "profile?seconds="+fmt.Sprint(int(d.Seconds())), churnProfile); err != nil {
		return err
	}
	if err := saveProfile(ctx, sock, "mutex", churnProfile+".mutex"); err != nil {
		return err
	}
	return saveProfile(ctx, sock, "block", churnProfile+".block")
}

// meteredPeer runs a peer's churn loop and notes in s the CPU its cycles
// cost: the host's, and the tool's processes' (reaped by this one, with
// everything they reaped), so that a paddock cycle's cost compares with a
// bare sandbox's on the same host in the same run.
func meteredPeer(s *section, name string, loop func() *churnResult) *churnResult {
	host0, _, herr := cpuTicks()
	var ru0, ru1 unix.Rusage
	cerr := unix.Getrusage(unix.RUSAGE_CHILDREN, &ru0)
	c := loop()
	host1, _, herr1 := cpuTicks()
	if cerr == nil {
		cerr = unix.Getrusage(unix.RUSAGE_CHILDREN, &ru1)
	}
	n := len(c.Cycles)
	if n == 0 || errors.Join(herr, herr1, cerr) != nil {
		return c
	}
	per := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(n)/1e6) }
	tool := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()) - time.Duration(ru0.Utime.Nano()+ru0.Stime.Nano())
	s.note("%s: CPU per cycle: the whole host %s, of which the tool and the processes it ran %s", name,
		per(time.Duration(host1-host0)*time.Second/userHZ), per(tool))
	return c
}

// meteredChurn runs the churn loop of cycle and notes in s the CPU its
// cycles cost the daemon's process tree: on a shared host that, not the
// rate, is what compares across runs.
func (r *rig) meteredChurn(ctx context.Context, s *section, name string, cycle func(context.Context) error) *churnResult {
	pid := r.daemon.pid()
	t0 := readTree(pid, r.cgroupParent)
	r.log.Info("churn loop", "name", name)
	c := churn(ctx, churnClients, churnTime, cycle)
	r.log.Info("churn loop done", "name", name)
	s.note("%s: CPU per cycle %s", name, readTree(pid, r.cgroupParent).sub(t0).perCycle(len(c.Cycles)))
	return c
}
