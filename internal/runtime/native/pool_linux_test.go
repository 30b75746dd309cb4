package native

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/image"
)

// TestPoolGrowsWithDemand: a create that finds its pool empty makes the
// pool keep one more guest (up to maxDemand), the refill then builds for
// it first, and a pool without hand-outs for demandIdle goes back to its
// size.
func TestPoolGrowsWithDemand(t *testing.T) {
	r := &Runtime{pools: map[string]*pool{}, building: map[string]bool{}}
	p := &pool{name: "image:host", target: 2, imageID: "sha256:a", src: runtime.PoolSource{DiskBytes: 1 << 30}}
	other := &pool{name: "template:t", target: 1, imageID: "sha256:b", src: runtime.PoolSource{DiskFrom: "/snap", DiskBytes: 1 << 30}}
	r.pools[p.name], r.pools[other.name] = p, other
	spec := runtime.Spec{Image: &image.Image{ID: "sha256:a"}}

	for i := range 3 {
		if g := r.takeWarm(context.Background(), spec); g != nil {
			t.Fatalf("take %d from an empty pool returned a guest", i)
		}
	}
	if p.want() != 5 || other.want() != 1 {
		t.Fatalf("after 3 misses: want %d and %d, expected 5 and 1 (only the matching pool grows)", p.want(), other.want())
	}
	if got := r.neediest(); got != p {
		t.Fatalf("the refill serves %v first, not the pool that missed", got)
	}
	p.building-- // as newGuest would

	for range 2 * maxDemand {
		r.takeWarm(context.Background(), spec)
	}
	if p.extra != maxDemand {
		t.Fatalf("demand grew to %d, past its bound %d", p.extra, maxDemand)
	}

	p.lastTake = time.Now().Add(-2 * demandIdle)
	r.neediest()
	if p.want() != p.target {
		t.Fatalf("an idle pool still wants %d, not its size %d", p.want(), p.target)
	}
}

// TestRefillWaitsForFirstAnswers: the refill waits while sandboxes
// handed out from a pool have not answered a first command, each up to
// its deadline, and then for refillSettle; not once a create found a
// pool empty, or waits for the refill.
func TestRefillWaitsForFirstAnswers(t *testing.T) {
	r := &Runtime{pools: map[string]*pool{}, building: map[string]bool{}, fresh: map[*Sandbox]time.Time{}, refill: make(chan struct{}, 1)}
	p := &pool{name: "image:host", target: 2, imageID: "sha256:a"}
	r.pools[p.name] = p
	settled := time.Now().Add(-time.Millisecond)
	if w := r.refillWait(settled); w > 0 {
		t.Fatalf("nothing handed out: the refill waits %v", w)
	}
	if w := r.refillWait(time.Now().Add(refillSettle)); w <= 0 || w > refillSettle {
		t.Fatalf("before it settled: the refill waits %v, want up to %v", w, refillSettle)
	}

	a, b := &Sandbox{id: "a"}, &Sandbox{id: "b"}
	r.handedOut(a)
	r.handedOut(b)
	if w := r.refillWait(settled); w < freshFor/2 {
		t.Fatalf("two hand-outs wait for their first answers: the refill waits %v", w)
	}
	a.answeredFirst()
	select {
	case <-r.refill:
	default:
		t.Fatal("a first answer did not wake the refill")
	}
	if w := r.refillWait(settled); w <= 0 {
		t.Fatal("one hand-out still waits for its first answer: the refill does not wait")
	}
	b.Kill() // no guest: only its hand-out ends
	if w := r.refillWait(settled); w > 0 {
		t.Fatalf("every hand-out answered or killed: the refill waits %v", w)
	}

	// A hand-out that never answers stops counting at its deadline.
	c := &Sandbox{id: "c"}
	r.handedOut(c)
	r.fresh[c] = time.Now().Add(-time.Millisecond)
	if w := r.refillWait(settled); w > 0 || len(r.fresh) != 0 {
		t.Fatalf("a hand-out past its deadline: the refill waits %v (%d fresh)", w, len(r.fresh))
	}

	d := &Sandbox{id: "d"}
	r.handedOut(d)
	p.waiting = 1
	if w := r.refillWait(settled); w > 0 {
		t.Fatalf("a create waits for the refill: the refill waits %v", w)
	}
	p.waiting = 0
	spec := runtime.Spec{Image: &image.Image{ID: "sha256:a"}}
	if g := r.takeWarm(context.Background(), spec); g != nil {
		t.Fatal("an empty pool handed out a guest")
	}
	if w := r.refillWait(time.Now().Add(refillSettle)); w > 0 {
		t.Fatalf("a create found the pool empty: the refill waits %v", w)
	}
}

// TestMissWaitsForGuestUnderWay: a create that finds its pool empty while
// the refill makes a guest for it waits for that guest rather than build
// one beside it; a second create, with no guest under way that another
// does not wait for, does not wait; a create whose awaited guest fails
// stops waiting.
func TestMissWaitsForGuestUnderWay(t *testing.T) {
	r := &Runtime{pools: map[string]*pool{}, building: map[string]bool{}, made: make(chan struct{}), refill: make(chan struct{}, 1)}
	p := &pool{name: "image:host", target: 1, imageID: "sha256:a", building: 1, src: runtime.PoolSource{DiskBytes: 1 << 30}}
	r.pools[p.name] = p
	spec := runtime.Spec{Image: &image.Image{ID: "sha256:a"}}
	waiting := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return p.waiting
	}
	finish := func(g *guestProc) { // as newGuest does
		r.mu.Lock()
		p.building--
		if g != nil {
			p.ready = append(p.ready, g)
		}
		close(r.made)
		r.made = make(chan struct{})
		r.mu.Unlock()
	}

	got := make(chan *guestProc)
	go func() { got <- r.takeWarm(context.Background(), spec) }()
	for deadline := time.Now().Add(5 * time.Second); waiting() != 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the create that missed does not wait for the guest under way")
		}
	}
	if g := r.takeWarm(context.Background(), spec); g != nil {
		t.Fatal("a second create took a guest from an empty pool")
	}
	if waiting() != 1 {
		t.Fatalf("%d creates wait for the one guest under way", waiting())
	}
	want := &guestProc{image: "sha256:a", diskBytes: 1 << 30, sb: &Sandbox{done: make(chan struct{})}}
	finish(want)
	if g := <-got; g != want {
		t.Fatalf("the waiting create got %v, not the guest made for it", g)
	}
	if waiting() != 0 || len(p.ready) != 0 {
		t.Fatalf("after the hand-out: %d waiting, %d ready; want 0 and 0", waiting(), len(p.ready))
	}

	p.building = 1
	go func() { got <- r.takeWarm(context.Background(), spec) }()
	for waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	finish(nil) // the refill failed to make it
	if g := <-got; g != nil {
		t.Fatalf("a create whose guest failed got %v", g)
	}
}

// TestEvictingHoldsRefill: while a start that evicted the pools for room
// retries, the refill makes no guest; and only refusals for room evict.
func TestEvictingHoldsRefill(t *testing.T) {
	r := &Runtime{pools: map[string]*pool{}, building: map[string]bool{}}
	p := &pool{name: "image:host", target: 2, extra: 3}
	r.pools[p.name] = p
	n, done := r.evictWarm()
	if n != 0 || p.extra != 0 {
		t.Fatalf("evicting empty pools: %d went, demand %d left; want 0 and 0", n, p.extra)
	}
	if name, start := r.nextGuest(); start != nil {
		t.Fatalf("the refill makes a guest for %q while a start evicts", name)
	}
	done()
	if _, start := r.nextGuest(); start == nil {
		t.Fatal("the refill makes nothing for an empty pool once the start is done")
	}
	for _, c := range []struct {
		err  error
		room bool
	}{
		{fmt.Errorf("getting disk: %w", errdefs.New(errdefs.ErrUnavailable, "disk: 1 GiB requested, 0 free")), true},
		{fmt.Errorf("starting guest: %w", syscall.ENOMEM), true},
		{errdefs.Invalid("disk", "too big"), false},
		{errors.New("guest exited"), false},
	} {
		if got := roomErr(c.err); got != c.room {
			t.Errorf("roomErr(%v) = %v, want %v", c.err, got, c.room)
		}
	}
}

// TestMemAvailableCached: a reading younger than memAvailableEvery is
// answered without reading /proc/meminfo again, an older one is not.
func TestMemAvailableCached(t *testing.T) {
	real := readMemAvailable()
	if real <= 0 {
		t.Fatalf("MemAvailable = %d", real)
	}
	const fake = 12345
	memRead.bytes.Store(fake)
	memRead.at.Store(time.Now().UnixNano())
	if got := memAvailable(); got != fake {
		t.Fatalf("fresh reading: got %d, want the cached %d", got, fake)
	}
	memRead.at.Store(time.Now().Add(-memAvailableEvery - time.Millisecond).UnixNano())
	if got := memAvailable(); got == fake || got <= 0 {
		t.Fatalf("stale reading: got %d, want /proc/meminfo's (about %d)", got, real)
	}
	if got := memRead.bytes.Load(); got == fake {
		t.Fatal("stale reading was not replaced")
	}
}
