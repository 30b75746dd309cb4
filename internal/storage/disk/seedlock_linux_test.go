package disk

import (
	"testing"
	"time"
)

// TestSeedMountedBesideMirrors: once a seed's mount was tried, asking
// whether it is mounted does not wait for the mirrors in progress (which
// hold its lock for reading): creates from one template mirror at once.
func TestSeedMountedBesideMirrors(t *testing.T) {
	p := &Pool{}
	s := &seed{tried: true, dir: "/seed"}
	s.mu.RLock() // a mirror in progress
	done := make(chan bool, 1)
	go func() { done <- p.seedMounted(s, "/img", source{}) }()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("a mounted seed reported not mounted")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("seedMounted waited for a mirror in progress")
	}
	s.mu.RUnlock()
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	if p.seedMounted(s, "/img", source{}) {
		t.Fatal("a dropped seed reported mounted")
	}
}
