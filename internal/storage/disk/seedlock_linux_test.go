package disk

import (
	"testing"
	"time"
)

// TestReadSeedBesideMirrors: once a seed's mount was tried, reading it
// does not wait for the mirrors in progress (which hold its lock for
// reading): creates from one template mirror at once.
func TestReadSeedBesideMirrors(t *testing.T) {
	p := &Pool{}
	s := &seed{tried: true, dir: "/seed"}
	s.mu.RLock() // a mirror in progress
	done := make(chan bool, 1)
	read := func() bool {
		ok := p.readSeed(s, "/img", source{})
		if ok {
			s.mu.RUnlock()
		}
		return ok
	}
	go func() { done <- read() }()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("a mounted seed reported not mounted")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("readSeed waited for a mirror in progress")
	}
	s.mu.RUnlock()
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	if read() {
		t.Fatal("a dropped seed reported mounted")
	}
}
