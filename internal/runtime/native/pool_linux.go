package native

import (
	"bufio"
	"context"
	"errors"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/runtime"
)

var _ runtime.Pools = (*Runtime)(nil)

// pool is a warm pool: guests prepared from one source, kept until a
// create takes one.
type pool struct {
	name   string
	src    runtime.PoolSource
	target int
	ready  []*guestProc // oldest first
	// building counts guests being made for it.
	building int
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
		if len(p.ready) > size {
			drop = append(drop, p.ready[size:]...)
			p.ready = p.ready[:size]
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

// keepWarm refills the pools, one guest at a time, backing off on errors
// and while the host is short of memory.
func (r *Runtime) keepWarm() {
	defer r.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-r.stop:
			return
		case <-r.refill:
		}
		// Let a burst of creates finish before competing with it.
		for settled := false; !settled; {
			select {
			case <-r.stop:
				return
			case <-r.refill:
			case <-time.After(refillSettle):
				settled = true
			}
		}
		for {
			name, start := r.nextGuest()
			if start == nil {
				break
			}
			var err error = errShortOfMemory
			if memAvailable() >= minFreeMemory {
				err = start()
			}
			if err != nil {
				select {
				case <-r.stop:
					return
				default:
				}
				if err != errShortOfMemory {
					r.log.Warn("starting a warm guest", "pool", name, "err", err, "retry_in", backoff)
				}
				select {
				case <-r.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 30*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
			select {
			case <-r.stop:
				return
			default:
			}
		}
	}
}

var errShortOfMemory = errors.New("the host is short of memory")

// nextGuest says which guest the refill makes next: for the pool
// furthest below its size, else a blank guest (blank_linux.go) while
// there are fewer than BlankGuests; start is nil when all are full (or
// the guests of all pools reach maxWarm).
func (r *Runtime) nextGuest() (name string, start func() error) {
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
// full (or the guests of all pools reach maxWarm).
func (r *Runtime) neediest() *pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	total := len(r.building) + len(r.blank[forNew]) + len(r.blank[forRestart])
	names := make([]string, 0, len(r.pools))
	for name, p := range r.pools {
		total += len(p.ready)
		names = append(names, name)
	}
	if total >= maxWarm {
		return nil
	}
	sort.Strings(names)
	var best *pool
	bestNeed := 0
	for _, name := range names {
		p := r.pools[name]
		if need := p.target - len(p.ready) - p.building; need > bestNeed {
			best, bestNeed = p, need
		}
	}
	if best != nil {
		best.building++
	}
	return best
}

// refillSettle is how long the pools wait after a create before they
// start another guest.
const refillSettle = 50 * time.Millisecond

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
			p.src.DiskBytes == src.DiskBytes && len(p.ready) < p.target
		if keep {
			p.ready = append(p.ready, g)
		}
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
	g, err = r.build(ctx, runtime.Spec{ID: id, Image: img, Resources: api.Resources{DiskBytes: src.DiskBytes}, DiskFrom: src.DiskFrom}, true)
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
	raisePriority(g.sb.st.PID)
	g.raised = true
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

// takeWarm returns a live warm guest made from spec's image,
// DiskFrom and disk size, if there is one.
func (r *Runtime) takeWarm(spec runtime.Spec) *guestProc {
	size := spec.Resources.DiskBytes
	for {
		r.mu.Lock()
		var g *guestProc
	search:
		for _, p := range r.pools {
			for i, c := range p.ready {
				if c.image == spec.Image.ID && c.diskFrom == spec.DiskFrom && (size == 0 || size == c.diskBytes) {
					g = c
					p.ready = append(p.ready[:i:i], p.ready[i+1:]...)
					break search
				}
			}
		}
		r.mu.Unlock()
		if g == nil {
			return nil
		}
		if !g.sb.exited() {
			return g
		}
		r.discard(g)
	}
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() int64 {
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
