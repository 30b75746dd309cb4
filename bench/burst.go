package main

// Issue 21's burst bar: 50 creates released at once, each to the first
// output of `echo hi`.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

const (
	burstSize   = 50
	burstRounds = 4
	burstP50Max = 30 * time.Millisecond
	burstP99Max = 100 * time.Millisecond
	defaultPool = "image:" + hostImage
)

// burstSample is one create of a burst.
type burstSample struct {
	ID      string
	Created time.Duration // release → Create returned
	First   time.Duration // release → first stdout byte of echo hi
	Err     error
}

// burstRound is one burst of burstSize creates.
type burstRound struct {
	Samples       []burstSample
	ReadyBefore   int // the default pool's ready guests at the release (GET /v1/pools)
	ReadyAfter    int // the same once every create had answered
	Target        int // the size the pool is kept at
	FromPool      int // sandboxes whose id was a ready warm guest's at the release
	Wall          time.Duration
	FirstErr      error
	Errors        int
	NoSpace       int // creates refused for want of disk space on the host
	DeleteErr     error
	poolReadError error
}

func (b *burstRound) firsts() []time.Duration {
	var out []time.Duration
	for _, s := range b.Samples {
		if s.Err == nil {
			out = append(out, s.First)
		}
	}
	return out
}

func burstMethod() []string {
	return []string{
		fmt.Sprintf("The default image's pool (`%s`) is sized for the burst first: `PUT /v1/pools` (`paddock pool set %s %d`), as a platform "+
			"expecting bursts of %d would; its guests are then made at the refill's pace and within its bounds (host MemAvailable ≥ 512 MiB, "+
			"256 warm guests in all). The pool goes back to its size after the section.", defaultPool, defaultPool, burstSize, burstSize),
		fmt.Sprintf("%d rounds. Before each the harness waits until the default image's pool (`%s`) is full again and the daemon is idle. "+
			"Then %d goroutines, each already blocked on one channel, are released together by closing it; the clock of every sample "+
			"starts at that release (one instant for all %d), so time a create spends queued in the client or the daemon is counted. "+
			"Each goroutine calls `Create` (default image and limits) then `Exec(echo hi)`; its sample ends when the first stdout byte "+
			"reaches the SDK's writer. Every output is checked to be `hi\\n`; a failed create or exec is an error, not a sample.",
			burstRounds, defaultPool, burstSize, burstSize),
		"One client object (the Go SDK's, its HTTP connections kept alive) serves all goroutines, as an agent platform's would.",
		fmt.Sprintf("The daemon admits thin disks up to %d× the host's free space less a margin; fifty default 10 GiB disks and the pools' need "+
			"about %s free. When the host has less (this shared machine often does), every create asks for a %s disk instead, which the default "+
			"pool's warm guests and ready disks do not serve: each such create binds a blank guest and makes its disk on the spot. The bar's row says which.",
			diskOvercommit, mib(burstSpace), mib(densityDisk)),
		"**From the pool**: how many of the sandboxes have the id of a warm guest that was ready at the release (the daemon names a " +
			"warm guest by the id it hands out; the harness lists `run/warm` just before the release). The rest were made during the " +
			"burst: forked and bound on the spot, or refilled and handed out meanwhile. `GET /v1/pools` is read before the release and " +
			"after the last create answered.",
		"The round's sandboxes are deleted together after its last sample, outside every clock. p50 and p99 are nearest-rank, per round " +
			"and over all rounds' samples pooled.",
		fmt.Sprintf("**The same burst by peers**, in every round before paddock's (the pool full, the daemon idle before each): %d goroutines released "+
			"the same way, each spawning a process with stdout on a pipe and timed from the release to its first stdout byte, the output checked "+
			"to be `hi\\n`. **host**: `echo hi` by Go's os/exec, no isolation: the floor of %d first outputs on this host's cores. **bwrap**: `echo hi` "+
			"with the flags of the cold table (every namespace, /usr read-only, fresh /proc, /dev, /tmp). Both `echo`s get a sandbox's "+
			"environment (PATH, LANG=C.UTF-8).", burstSize, burstSize),
	}
}

// benchBurst releases burstSize creates at once, several rounds.
func benchBurst(ctx context.Context, r *rig) *section {
	s := &section{Method: burstMethod()}
	req, small := burstRequest()
	if small {
		s.note("the host had %s free: the bursts asked for %s disks (see the method)", mib(hostFree()), mib(densityDisk))
	}
	if !small {
		restore, err := r.sizePool(ctx, defaultPool, burstSize)
		if err != nil {
			s.Err = err
			return s
		}
		defer func() {
			if err := restore(); err != nil {
				s.note("%v", err)
			}
		}()
	}
	s.note("load average at the start of the section: %s", loadAvg())
	peers := r.burstPeers()
	var rounds []*burstRound
	for i := range burstRounds {
		if err := r.waitFullPool(ctx, defaultPool); err != nil {
			s.Err = err
			break
		}
		// The peers go first, while the pool is full and the daemon idle:
		// its refill after paddock's burst would take their CPU.
		for _, p := range peers {
			r.idle(ctx)
			p.round(ctx)
		}
		r.idle(ctx)
		b, err := r.burst(ctx, req)
		rounds = append(rounds, b)
		if err != nil {
			s.Err = fmt.Errorf("round %d: %w", i+1, err)
			break
		}
		r.log.Info("burst", "round", i+1, "errors", b.Errors, "from_pool", b.FromPool)
	}
	burstTable(s, rounds)
	s.Bars = burstBars(rounds, small)
	burstPeerTable(s, rounds, peers)
	return s
}

// burstPeer is the same burst by a tool other than paddock: burstSize
// spawns of argv released at once, each timed to its first stdout byte.
type burstPeer struct {
	name     string
	argv     []string
	env      []string        // nil: the bench's own
	firsts   []time.Duration // every round's, pooled
	walls    []time.Duration
	rounds   int
	errors   int
	firstErr error
}

// burstPeers are the host's floor for the burst: the bare fork/exec of
// `echo hi` (Go's os/exec, no isolation) and bwrap with the isolation
// flags of the cold and churn tables, each `echo` in a sandbox's
// environment (peerEnv).
func (r *rig) burstPeers() []*burstPeer {
	peers := []*burstPeer{{name: "host: fork/exec, no isolation", argv: echoHi(), env: peerEnv()}}
	if r.bwrap != "" {
		peers = append(peers, &burstPeer{name: toolBwrap, argv: bwrapArgv(r.bwrap, echoHi()...)})
	}
	return peers
}

// round releases burstSize spawns at once, as burst does paddock's
// creates: the goroutines wait on one channel, and every sample's clock
// starts at its closing.
func (p *burstPeer) round(ctx context.Context) {
	type sample struct {
		first time.Duration
		err   error
	}
	samples := make([]sample, burstSize)
	release := make(chan struct{})
	var (
		wg sync.WaitGroup
		t0 time.Time // written before release is closed, read after
	)
	for i := range samples {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			t, err := timeProcessSince(ctx, p.argv, p.env, t0)
			if err == nil {
				err = wantOutput(p.name, t.Stdout, coldOutput)
			}
			samples[i] = sample{first: t.First, err: err}
		}()
	}
	t0 = time.Now()
	close(release)
	wg.Wait()
	p.walls = append(p.walls, time.Since(t0))
	p.rounds++
	for _, sm := range samples {
		if sm.err != nil {
			p.errors++
			if p.firstErr == nil {
				p.firstErr = sm.err
			}
			continue
		}
		p.firsts = append(p.firsts, sm.first)
	}
}

// burstPeerTable puts paddock's pooled samples beside the peers'.
func burstPeerTable(s *section, rounds []*burstRound, peers []*burstPeer) {
	t := table{Header: []string{"the same burst, same run", "served", "errors", "first output p50", "p90", "p99", "max", "wall p50"}}
	var firsts, walls []time.Duration
	errs := 0
	for _, b := range rounds {
		firsts = append(firsts, b.firsts()...)
		walls = append(walls, b.Wall)
		errs += b.Errors
	}
	row := func(name string, firsts, walls []time.Duration, n, errs int) {
		fs := summarize(firsts)
		t.add(name, fmt.Sprintf("%d of %d", fs.N, n), fmt.Sprint(errs), ms(fs.Median), ms(fs.P90), ms(fs.P99), ms(fs.Max), ms(summarize(walls).Median))
	}
	row("paddock: Create → Exec(echo hi)", firsts, walls, burstSize*len(rounds), errs)
	var vals []string
	for _, p := range peers {
		row(p.name, p.firsts, p.walls, burstSize*p.rounds, p.errors)
		if p.firstErr != nil {
			s.note("%s: first error: %s", p.name, truncate(p.firstErr.Error(), 300))
		}
		if sm := summarize(p.firsts); sm.N > 0 {
			vals = append(vals, fmt.Sprintf("%s p50 %s, p99 %s", p.name, ms(sm.Median), ms(sm.P99)))
		}
	}
	s.Tables = append(s.Tables, t)
	b := bar{Issue: 21, What: fmt.Sprintf("the same burst (%d at once, each → first output of `echo hi`) by the host's bare fork/exec and by bwrap, same run", burstSize),
		Target: "reported", Value: noPeerValue, Verdict: notMeasured}
	if len(vals) > 0 {
		b.Value, b.Verdict = strings.Join(vals, "; "), reported
	}
	s.Bars = append(s.Bars, b)
}

// burstSpace is the host's free space below which the bursts ask for
// small disks: the daemon admits thin disks up to 100× the free space
// less a margin of a few GiB, and fifty 10 GiB disks and the pools' are
// about 600 GiB.
const burstSpace = 10 << 30

// burstRequest is the default create, or one with a small disk when the
// host's free space cannot promise fifty default disks.
func burstRequest() (api.CreateRequest, bool) {
	if hostFree() >= burstSpace {
		return api.CreateRequest{}, false
	}
	return smallDisk(), true
}

// sizePool sets pool's size; restore sets it back to what it was.
func (r *rig) sizePool(ctx context.Context, pool string, size int) (restore func() error, _ error) {
	p, err := r.client.Pools(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading the pools: %w", err)
	}
	prev := p.Target[pool]
	if _, err := r.client.SetPool(ctx, pool, size); err != nil {
		return nil, fmt.Errorf("sizing pool %s: %w", pool, err)
	}
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if _, err := r.client.SetPool(ctx, pool, prev); err != nil {
			return fmt.Errorf("setting pool %s back to %d: %w", pool, prev, err)
		}
		return nil
	}, nil
}

// waitFullPool waits until pool holds as many ready sandboxes as its
// target, and the daemon is idle.
func (r *rig) waitFullPool(ctx context.Context, pool string) error {
	p, err := r.client.Pools(ctx)
	if err != nil {
		return fmt.Errorf("reading the pools: %w", err)
	}
	return r.waitPool(ctx, pool, p.Target[pool])
}

// burst runs one round. Its error is one that ends the section (a failed
// delete, an interrupt); failed creates are counted in the round.
func (r *rig) burst(ctx context.Context, req api.CreateRequest) (*burstRound, error) {
	b := &burstRound{Samples: make([]burstSample, burstSize)}
	warm := warmIDs(r.root)
	if p, err := r.client.Pools(ctx); err == nil {
		b.ReadyBefore, b.Target = p.Ready[defaultPool], p.Target[defaultPool]
	} else {
		b.poolReadError = err
	}
	release := make(chan struct{})
	var (
		wg sync.WaitGroup
		t0 time.Time // written before release is closed, read after
	)
	for i := range b.Samples {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			b.Samples[i] = r.burstOne(ctx, req, t0)
		}()
	}
	t0 = time.Now()
	close(release)
	wg.Wait()
	b.Wall = time.Since(t0)
	if p, err := r.client.Pools(ctx); err == nil {
		b.ReadyAfter = p.Ready[defaultPool]
	} else {
		b.poolReadError = err
	}
	var ids []string
	for i := range b.Samples {
		sm := &b.Samples[i]
		if sm.ID != "" {
			ids = append(ids, sm.ID)
			if warm[sm.ID] {
				b.FromPool++
			}
		}
		if sm.Err != nil {
			b.Errors++
			if strings.Contains(sm.Err.Error(), "unavailable: disk") {
				b.NoSpace++
			}
			if b.FirstErr == nil {
				b.FirstErr = sm.Err
			}
		}
	}
	b.DeleteErr = r.removeConcurrently(ids, burstSize)
	return b, errors.Join(b.DeleteErr, ctx.Err())
}

// burstOne is one goroutine's sample, timed from t0, the release.
func (r *rig) burstOne(ctx context.Context, req api.CreateRequest, t0 time.Time) burstSample {
	echo := api.ExecRequest{Cmd: echoHi()}
	sb, err := r.client.Create(ctx, req)
	created := time.Since(t0)
	if err != nil {
		return burstSample{Err: fmt.Errorf("creating: %w", err)}
	}
	r.track(sb.ID)
	out := &firstWrite{}
	st, err := r.client.Exec(ctx, sb.ID, echo, client.ExecIO{Stdout: out})
	if err := errors.Join(execResult(echo.Cmd, st, err, ""), wantOutput(toolSDK, out.buf.Bytes(), coldOutput)); err != nil {
		return burstSample{ID: sb.ID, Err: err}
	}
	return burstSample{ID: sb.ID, Created: created, First: out.at.Sub(t0)}
}

// warmIDs are the ids of the warm guests ready now: the names under
// run/warm, which a hand-out renames to the sandbox's directory.
func warmIDs(root string) map[string]bool {
	ents, _ := os.ReadDir(filepath.Join(root, "run", "warm"))
	ids := make(map[string]bool, len(ents))
	for _, e := range ents {
		ids[e.Name()] = true
	}
	return ids
}

// removeConcurrently deletes sandboxes with up to n deletes at once,
// each with its own deadline rather than the caller's: it runs on the way
// out too, also for a thousand sandboxes.
func (r *rig) removeConcurrently(ids []string, n int) error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, max(n, 1))
	)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			if err := r.remove(ctx, id); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func burstTable(s *section, rounds []*burstRound) {
	t := table{Header: []string{"round", "served", "errors (no disk space)", "first output p50", "p90", "p99", "max", "Create p50", "from the pool", "pool ready before → after (target)", "wall"}}
	var all, allCreated []time.Duration
	var errs, noSpace, served, fromPool int
	for i, b := range rounds {
		f := b.firsts()
		var created []time.Duration
		for _, sm := range b.Samples {
			if sm.Err == nil {
				created = append(created, sm.Created)
			}
		}
		fs, cs := summarize(f), summarize(created)
		t.add(fmt.Sprint(i+1), fmt.Sprintf("%d of %d", fs.N, burstSize), fmt.Sprintf("%d (%d)", b.Errors, b.NoSpace), ms(fs.Median), ms(fs.P90), ms(fs.P99), ms(fs.Max),
			ms(cs.Median), fmt.Sprint(b.FromPool), fmt.Sprintf("%d → %d (%d)", b.ReadyBefore, b.ReadyAfter, b.Target), ms(b.Wall))
		all, allCreated = append(all, f...), append(allCreated, created...)
		errs, noSpace, served, fromPool = errs+b.Errors, noSpace+b.NoSpace, served+fs.N, fromPool+b.FromPool
		if b.FirstErr != nil {
			s.note("round %d: first error: %s", i+1, truncate(b.FirstErr.Error(), 300))
		}
		if b.poolReadError != nil {
			s.note("round %d: reading the pools failed: %v", i+1, b.poolReadError)
		}
	}
	if len(rounds) > 1 {
		fs, cs := summarize(all), summarize(allCreated)
		t.add("all rounds", fmt.Sprintf("%d of %d", served, burstSize*len(rounds)), fmt.Sprintf("%d (%d)", errs, noSpace), ms(fs.Median), ms(fs.P90), ms(fs.P99), ms(fs.Max),
			ms(cs.Median), fmt.Sprint(fromPool), "", "")
	}
	s.Tables = append(s.Tables, t)
	if noSpace > 0 {
		s.note("%d creates were refused for want of disk space: the daemon promises thin disks up to %d× the host's free space (%s now), "+
			"and %d default disks of 10 GiB and the pools' need more; those are counted as errors, not as slow creates", noSpace, diskOvercommit, mib(hostFree()), burstSize)
	}
}

// hostFree is the free space of the filesystem under the run's directory
// (the temporary directory's); 0 if unreadable.
func hostFree() int64 {
	var st unix.Statfs_t
	if unix.Statfs(os.TempDir(), &st) != nil {
		return 0
	}
	return int64(st.Bavail) * st.Bsize
}

func burstBars(rounds []*burstRound, small bool) []bar {
	what := fmt.Sprintf("burst: %d creates at once, each → first output of `echo hi` (all rounds pooled)", burstSize)
	if small {
		what = fmt.Sprintf("burst: %d creates at once (disks of %s: the host's free space is short), each → first output of `echo hi` (all rounds pooled)", burstSize, mib(densityDisk))
	}
	b := bar{Issue: 21, What: what,
		Target: "p50 ≤ 30 ms, p99 ≤ 100 ms, 0 errors", Value: noPeerValue, Verdict: notMeasured}
	var all []time.Duration
	errs := 0
	for _, r := range rounds {
		all = append(all, r.firsts()...)
		errs += r.Errors
	}
	if len(all) > 0 {
		sm := summarize(all)
		b.Value = fmt.Sprintf("p50 %s, p99 %s, %d errors (%d samples, %d rounds)", ms(sm.Median), ms(sm.P99), errs, sm.N, len(rounds))
		b.Verdict = check(sm.Median <= burstP50Max && sm.P99 <= burstP99Max && errs == 0)
	}
	return []bar{b}
}
