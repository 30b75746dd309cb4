package disk

import (
	"testing"
	"time"
)

// TestRecycleSurge: a pool at twice its size takes a volume given back
// only while the refill made one within recycleHold, at most
// recycleFactor times its size more; the surge ends with the hold, and a
// closed pool takes none.
func TestRecycleSurge(t *testing.T) {
	const size = 2
	full := func(n int) *Pool {
		p := &Pool{cfg: Config{PoolSize: size}}
		for range n {
			p.ready = append(p.ready, &entry{})
		}
		return p
	}
	take := func(p *Pool) bool {
		ok := p.wantsOrSurges()
		if ok {
			p.ready = append(p.ready, &entry{})
		}
		return ok
	}

	p := full(recycleFactor*size - 1)
	if !take(p) {
		t.Fatal("a pool below twice its size refused a volume")
	}
	if take(p) {
		t.Fatal("a full pool whose refill never made a volume took one")
	}

	p = full(recycleFactor * size)
	p.lastMade = time.Now().Add(-recycleHold - time.Second)
	if take(p) {
		t.Fatal("a full pool took a volume after the hold")
	}

	p = full(recycleFactor * size)
	p.lastMade = time.Now()
	kept := 0
	for take(p) {
		if kept++; kept > 10*size {
			t.Fatal("the surge has no bound")
		}
	}
	if kept != recycleFactor*size {
		t.Fatalf("surged by %d volumes, want %d", kept, recycleFactor*size)
	}
	// The hold ends: the surge with it (the volumes kept stay ready
	// until taken).
	p.lastMade = time.Now().Add(-recycleHold)
	p.ready = p.ready[:recycleFactor*size-1]
	if !take(p) {
		t.Fatal("a pool below twice its size refused a volume after the surge")
	}
	if take(p) || p.surge != 0 {
		t.Fatalf("the surge outlived the hold: surge %d", p.surge)
	}

	p = full(0)
	p.closed = true
	if p.wantsOrSurges() {
		t.Fatal("a closed pool took a volume")
	}
}
