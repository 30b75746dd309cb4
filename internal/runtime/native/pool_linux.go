package native

import (
	"bufio"
	"context"
	"os"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/runtime"
)

var (
	_ runtime.Pools    = (*Runtime)(nil)
	_ runtime.PoolRoom = (*Runtime)(nil)
)

// HasPoolRoom implements runtime.PoolRoom: the bound its own refill keeps.
func (r *Runtime) HasPoolRoom() bool { return memAvailable() >= minFreeMemory }

// pool is a warm pool: guests prepared from one source, kept until a
// create takes one.
type pool struct {
	name   string
	src    runtime.PoolSource
	target int
	ready  []*guestProc // oldest first
	// building counts guests being made for it; waiting, the creates
	// waiting for one of those (takeWarm), never more than building.
	building int
	waiting  int
	// extra is how many more than target it keeps for demand (want);
	// lastTake is its last hand-out or miss; imageID is the image its
	// guests are made from (known once one is made), which a miss is
	// matched on.
	extra    int
	lastTake time.Time
	imageID  string
}

// minFreeMemory is the host memory a refill leaves available: a warm
// guest is only made while MemAvailable is above it.
const minFreeMemory = 512 << 20

// maxWarm bounds the warm guests of all pools together.
const maxWarm = 256

func (r *Runtime) defaultPoolName() string {
	if r.cfg.WarmImage != nil {
		if img, err := r.cfg.WarmImage(); err == nil {
			return "image:" + img.Name
		}
	}
	return "image:default"
}

// SetPool implements runtime.Pools. A pool whose source changes (a
// template rebuilt) drops the guests made from the old one.
func (r *Runtime) SetPool(name string, src runtime.PoolSource, size int) {
	r.mu.Lock()
	p := r.pools[name]
	var drop []*guestProc
	switch {
	case size <= 0:
		if p != nil {
			drop = p.ready
			delete(r.pools, name)
		}
	case p == nil:
		r.pools[name] = &pool{name: name, src: src, target: size}
	default:
		if p.src.DiskFrom != src.DiskFrom || p.src.DiskBytes != src.DiskBytes {
			drop, p.ready = p.ready, nil
		}
		p.src, p.target = src, size
		if len(p.ready) > p.want() {
			drop = append(drop, p.ready[p.want():]...)
			p.ready = p.ready[:p.want()]
		}
	}
	r.mu.Unlock()
	for _, g := range drop {
		r.discard(g)
	}
	r.poke()
}

// PoolSizes implements runtime.Pools.
func (r *Runtime) PoolSizes() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.pools))
	for name, p := range r.pools {
		out[name] = len(p.ready)
	}
	return out
}

// PoolTargets implements runtime.Pools.
func (r *Runtime) PoolTargets() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.pools))
	for name, p := range r.pools {
		out[name] = p.target
	}
	return out
}

func (r *Runtime) poke() {
	select {
	case r.refill <- struct{}{}:
	default:
	}
}

// refillWorkers is how many guests the refill makes at once. Making one
// is mostly waiting (the fork, the guest's start-up, a disk's clone and
// mount, the guest's Prepare), done at a low priority by the forkers and
// the guests: two at a time on this 2-core host keep up with what one
// at a time could not (issue 21).
var refillWorkers = max(2, goruntime.NumCPU())

// keepWarm refills the pools, several guests at a time, backing off on
// errors and while the host is short of memory.
func (r *Runtime) keepWarm() {
	defer r.wg.Done()
	for {
		select {
		case <-r.stop:
			return
		case <-r.refill:
		case <-time.After(demandIdle / 4):
			// A pool idle for demandIdle loses the guests its demand
			// added (neediest) also when no create wakes the refill:
			// an idle daemon would keep them, and their memory, for good.
		}
		if !r.awaitQuiet() || !r.fill() {
			return
		}
	}
}

// awaitQuiet lets a burst of creates, and the first commands of the
// sandboxes they were handed, finish before the refill competes with
// them for the CPU: it returns once neither a create nor a first answer
// came for refillSettle and no sandbox handed out is still waiting for
// its first answer (fresh), or after maxRefillDefer. It returns at once
// when a create found a pool empty or waits for the refill: the next
// would build a guest on its own path, which costs it far more than the
// refill's competition. False when the runtime stops.
func (r *Runtime) awaitQuiet() bool {
	limit := time.NewTimer(maxRefillDefer)
	defer limit.Stop()
	quietFrom := time.Now()
	for {
		wait := r.refillWait(quietFrom.Add(refillSettle))
		if wait <= 0 {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-r.stop:
			t.Stop()
			return false
		case <-limit.C:
			t.Stop()
			return true
		case <-r.refill: // a create, or a first answer
			quietFrom = time.Now()
		case <-t.C:
		}
		t.Stop()
	}
}

// refillWait is how long the refill should still wait (awaitQuiet): until
// settled, and while sandboxes handed out from a pool wait for their first
// answer (each answer pokes the refill; one that never comes stops
// counting at its deadline); 0 if a create missed or waits.
func (r *Runtime) refillWait(settled time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.missed {
		return 0
	}
	for _, p := range r.pools {
		if p.waiting > 0 {
			return 0
		}
	}
	now := time.Now()
	wait := settled.Sub(now)
	for sb, until := range r.fresh {
		if !now.Before(until) {
			delete(r.fresh, sb)
			continue
		}
		wait = max(wait, until.Sub(now))
	}
	return wait
}

// handedOut counts sb, just handed out from a pool, as fresh until its
// guest answers a first command (Sandbox.answeredFirst), it is killed,
// or freshFor passes.
func (r *Runtime) handedOut(sb *Sandbox) {
	sb.firstAnswer = func() {
		r.mu.Lock()
		delete(r.fresh, sb)
		r.mu.Unlock()
		r.poke()
	}
	r.mu.Lock()
	r.fresh[sb] = time.Now().Add(freshFor)
	r.mu.Unlock()
}

// fill makes guests, refillWorkers at a time, until every pool and blank
// guest kind is full; false when the runtime stops.
func (r *Runtime) fill() bool {
	sem := make(chan struct{}, refillWorkers)
	var wg sync.WaitGroup
	defer wg.Wait()
	// backoff grows while starts fail (or memory is short) and is reset
	// by a start that succeeds; failed says one failed since the last
	// look.
	const firstBackoff = 100 * time.Millisecond
	var backoff atomic.Int64
	backoff.Store(int64(firstBackoff))
	var failed atomic.Bool
	for {
		select {
		case <-r.stop:
			return false
		case sem <- struct{}{}:
		}
		if failed.Swap(false) || memAvailable() < minFreeMemory {
			<-sem
			wait := time.Duration(backoff.Load())
			select {
			case <-r.stop:
				return false
			case <-time.After(wait):
			}
			backoff.Store(int64(min(2*wait, 30*time.Second)))
			continue
		}
		name, start := r.nextGuest()
		if start == nil {
			<-sem
			return true
		}
		r.mu.Lock()
		r.missed = false
		r.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := start(); err != nil {
				select {
				case <-r.stop:
				default:
					r.log.Warn("starting a warm guest", "pool", name, "err", err)
				}
				failed.Store(true)
				return
			}
			backoff.Store(int64(firstBackoff))
		}()
	}
}

// nextGuest says which guest the refill makes next: for the pool
// furthest below its size, else a blank guest (blank_linux.go) while
// there are fewer than BlankGuests; start is nil when all are full (or
// the guests of all pools reach maxWarm).
func (r *Runtime) nextGuest() (name string, start func() error) {
	r.mu.Lock()
	evicting := r.evicting > 0
	r.mu.Unlock()
	if evicting {
		return "", nil // poked again when the start that evicted ends
	}
	if p := r.neediest(); p != nil {
		return p.name, func() error { _, err := r.newGuest(p); return err }
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range r.blankKinds() {
		if len(r.blank[k])+r.blankBuilding[k] < r.cfg.BlankGuests && r.countLocked() < maxWarm {
			r.blankBuilding[k]++
			return "blank", func() error { return r.newBlank(k) }
		}
	}
	return "", nil
}

// countLocked counts the warm and blank guests, ready or being made.
func (r *Runtime) countLocked() int {
	n := len(r.building) + len(r.blank[forNew]) + len(r.blank[forRestart])
	for _, p := range r.pools {
		n += len(p.ready)
	}
	return n
}

// neediest returns the pool furthest below its size, or nil when all are
// full (or the guests of all pools reach maxWarm). Pools idle for
// demandIdle lose the guests their demand added.
func (r *Runtime) neediest() *pool {
	var drop []*guestProc
	defer func() {
		for _, g := range drop {
			r.discard(g)
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.pools))
	for name, p := range r.pools {
		if p.extra > 0 && time.Since(p.lastTake) > demandIdle {
			p.extra = 0
			if len(p.ready) > p.target {
				drop = append(drop, p.ready[p.target:]...)
				p.ready = p.ready[:p.target]
			}
		}
		names = append(names, name)
	}
	if r.countLocked() >= maxWarm {
		return nil
	}
	sort.Strings(names)
	var best *pool
	bestNeed := 0
	for _, name := range names {
		p := r.pools[name]
		if need := p.want() - len(p.ready) - p.building; need > bestNeed {
			best, bestNeed = p, need
		}
	}
	if best != nil {
		best.building++
	}
	return best
}

// want is how many guests p keeps ready: its size, and as many more as
// creates lately found it empty (up to maxDemand), so that a pool serving
// a sustained stream of creates grows until it keeps up with them, and
// shrinks back once they stop (demandIdle).
func (p *pool) want() int { return p.target + p.extra }

// maxDemand bounds the guests a pool keeps beyond its size for demand.
const maxDemand = 64

// demandIdle is how long a pool goes without a hand-out before the
// guests its demand added go.
const demandIdle = 30 * time.Second

// refillSettle is how long the pools wait after a create, or a first
// answer of a sandbox handed out, before they start another guest.
const refillSettle = 50 * time.Millisecond

// freshFor bounds how long a sandbox handed out from a pool holds the
// refill back while it waits for its first answer (one may never run a
// command), and maxRefillDefer how long they all may: creates that keep
// coming without missing must not stop the pools from refilling.
const (
	freshFor       = time.Second
	maxRefillDefer = time.Second
)

// warmPrefix names warm guests' disks until a create takes one; sandbox
// ids never start with it.
const warmPrefix = "warm-"

// newGuest makes a sandbox-to-be for pool p (whose building count the
// caller raised): an id, a uid range, a cgroup, a disk and a guest that
// has built its root filesystem and bounded itself. It waits blocked in
// recvmsg, which costs no CPU; it is not frozen: a thaw wakes all its
// threads at once, and on this kind of host that cost the first command
// of a hand-out 1.5-2 ms. Only its limits and environment are left for
// the create that takes it.
func (r *Runtime) newGuest(p *pool) (_ *guestProc, retErr error) {
	id := r.newBuildingID()
	r.mu.Lock()
	src := p.src
	r.mu.Unlock()
	var g *guestProc
	defer func() {
		r.mu.Lock()
		delete(r.building, id)
		p.building--
		keep := retErr == nil && r.pools[p.name] == p && p.src.DiskFrom == src.DiskFrom &&
			p.src.DiskBytes == src.DiskBytes && (len(p.ready) < p.want() || p.waiting > 0)
		if keep {
			p.ready = append(p.ready, g)
			p.imageID = g.image
		}
		close(r.made)
		r.made = make(chan struct{})
		r.mu.Unlock()
		if retErr == nil && !keep {
			r.discard(g) // the pool shrank or changed meanwhile
		}
	}()
	img, err := src.Image()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	awaited := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return p.waiting > 0
	}
	g, err = r.build(ctx, runtime.Spec{ID: id, Image: img, Resources: api.Resources{DiskBytes: src.DiskBytes}, DiskFrom: src.DiskFrom}, true, awaited)
	if err != nil {
		return nil, err
	}
	g.diskFrom, g.diskBytes = src.DiskFrom, src.DiskBytes
	if l := src.Limits; l.CPUs > 0 && l.MemoryBytes > 0 && l.Pids > 0 {
		lim := limitsOf(l)
		if err := g.sb.cg.Update(lim); err != nil {
			r.discard(g)
			return nil, err
		}
		g.limits = lim
	}
	// Built at a low priority, so as not to slow running sandboxes; raised
	// to the normal one now, so that a hand-out need not (0.5-1.5 ms on
	// its path on a small host).
	if !g.raised {
		raisePriority(g.sb.st.PID, g.sb.cg)
		g.raised = true
	}
	return g, nil
}

// newBuildingID picks the id of a guest about to be made ahead of time
// and marks it as being made (IsWarm, Leftovers) until the maker deletes
// it from r.building.
func (r *Runtime) newBuildingID() string {
	id := runtime.NewID()
	r.mu.Lock()
	r.building[id] = true
	r.mu.Unlock()
	return id
}

// warmWait bounds how long a create that finds its pool empty waits for
// a guest the refill is making for it, before it builds one itself: a
// guest under way, raised to the normal priority once awaited, is ready
// before one started later, so the bound only guards against a refill
// that stalls. Building one on the spot costs 150-250 ms under churn here
// (fork, disk, Prepare) and duplicates the refill's work; in alternated
// churn runs a 250 ms bound (waiters gave up and built anyway) did worse
// than 1 s.
const warmWait = time.Second

// takeWarm returns a live warm guest made from spec's image, DiskFrom
// and disk size, if there is one. A pool of that source found empty
// grows (want) and is refilled at once; if the refill is making guests
// for it that no other create waits for, this one waits for the first
// ready (up to warmWait) rather than build a guest beside them.
func (r *Runtime) takeWarm(ctx context.Context, spec runtime.Spec) *guestProc {
	size := spec.Resources.DiskBytes
	match := func(image, diskFrom string, diskBytes int64) bool {
		return image == spec.Image.ID && diskFrom == spec.DiskFrom && (size == 0 || size == diskBytes)
	}
	var waitOn *pool // the pool this create waits on, once it does
	var timeout <-chan time.Time
	defer func() {
		if waitOn != nil {
			r.mu.Lock()
			waitOn.waiting--
			r.mu.Unlock()
		}
	}()
	missed := false
	for {
		r.mu.Lock()
		var g *guestProc
	search:
		for _, p := range r.pools {
			for i, c := range p.ready {
				if match(c.image, c.diskFrom, c.diskBytes) {
					g = c
					p.ready = append(p.ready[:i:i], p.ready[i+1:]...)
					p.lastTake = time.Now()
					break search
				}
			}
		}
		var made chan struct{}
		if g == nil {
			for _, p := range r.pools {
				if p.imageID == "" || !match(p.imageID, p.src.DiskFrom, p.src.DiskBytes) {
					continue
				}
				if !missed {
					p.lastTake = time.Now()
					p.extra = min(p.extra+1, maxDemand)
				}
				if waitOn == nil && p.building > p.waiting {
					waitOn = p
					p.waiting++
				}
			}
			if !missed {
				// The refill stops waiting for quiet (awaitQuiet).
				r.missed = true
				defer r.poke()
			}
			missed = true
			if waitOn != nil && waitOn.building > 0 {
				made = r.made
			}
		}
		r.mu.Unlock()
		if g != nil {
			if !g.sb.exited() {
				return g
			}
			r.discard(g)
			continue
		}
		if made == nil {
			return nil
		}
		if timeout == nil {
			r.poke() // the pool grew: the refill starts more at once
			t := time.NewTimer(warmWait)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-made:
		case <-timeout:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
}

// evictWarm discards every ready warm and blank guest, and the demand
// that grew the pools, so that what they hold (a disk promise each, loop
// devices, memory, uid ranges) goes to a start that was refused for it.
// It returns how many went and a done that the start calls once it has
// retried: until then the refill makes none.
func (r *Runtime) evictWarm() (int, func()) {
	r.mu.Lock()
	r.evicting++
	var drop []*guestProc
	for _, p := range r.pools {
		drop = append(drop, p.ready...)
		p.ready, p.extra = nil, 0
	}
	for k := range r.blank {
		drop = append(drop, r.blank[k]...)
		r.blank[k] = nil
	}
	r.mu.Unlock()
	for _, g := range drop {
		r.discard(g)
	}
	return len(drop), func() {
		r.mu.Lock()
		r.evicting--
		r.mu.Unlock()
	}
}

// memAvailableEvery is how stale memAvailable's answer may be. The refill
// asks before every guest it starts, and under churn reading /proc/meminfo
// (the kernel sums every zone's counters for it) was ~2% of the daemon's
// CPU; the few guests started on a 100 ms old reading are a few MiB
// against minFreeMemory's 512 MiB.
const memAvailableEvery = 100 * time.Millisecond

// memRead is memAvailable's last reading: when (unix nanoseconds, 0 for
// none yet) and the bytes.
var memRead struct{ at, bytes atomic.Int64 }

// memAvailable is MemAvailable from /proc/meminfo, in bytes, read at most
// every memAvailableEvery.
func memAvailable() int64 {
	now := time.Now().UnixNano()
	if at := memRead.at.Load(); at != 0 && now-at < int64(memAvailableEvery) {
		return memRead.bytes.Load()
	}
	b := readMemAvailable()
	memRead.bytes.Store(b)
	memRead.at.Store(now)
	return b
}

// readMemAvailable reads MemAvailable from /proc/meminfo, in bytes.
func readMemAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
