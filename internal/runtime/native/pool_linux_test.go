package native

import (
	"testing"
	"time"

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
		if g := r.takeWarm(spec); g != nil {
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
		r.takeWarm(spec)
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

// TestStarved: the refill skips its settling pause only when a pool or a
// kind of blank guest has nothing ready or on the way.
func TestStarved(t *testing.T) {
	r := &Runtime{pools: map[string]*pool{}, building: map[string]bool{}, cfg: Config{BlankGuests: 1}}
	r.blank[forNew] = []*guestProc{{}}
	p := &pool{name: "image:host", target: 1}
	r.pools[p.name] = p
	if !r.starved() {
		t.Fatal("an empty pool is not starved")
	}
	p.building = 1
	if r.starved() {
		t.Fatal("a pool with a guest on the way is starved")
	}
	r.blank[forNew] = nil
	if !r.starved() {
		t.Fatal("no blank guest ready is not starved")
	}
}
