package shrink

import (
	"runtime"
	"testing"
)

func TestMap(t *testing.T) {
	m := map[int]int{}
	peak := 0
	for i := range 1000 {
		m[i] = i
	}
	orig := m
	copied := 0
	for i := range 1000 {
		delete(m, i)
		before := len(m)
		if m = Map(m, &peak); !sameMap(m, orig) {
			copied++
			orig = m
			if len(m) != before {
				t.Fatalf("the copy holds %d entries, the map %d", len(m), before)
			}
		}
		for j := i + 1; j < 1000; j++ {
			if m[j] != j {
				t.Fatalf("after deleting %d, entry %d is %d", i, j, m[j])
			}
		}
	}
	// 1000 → 250 → 62 (under minPeak from then on).
	if copied != 2 {
		t.Errorf("copied %d times, want 2", copied)
	}
	small, p := map[int]int{1: 1}, 0
	delete(small, 1)
	if got := Map(small, &p); !sameMap(got, small) {
		t.Error("a small map was copied")
	}
}

// TestMapFreesBuckets: what a map that held 100,000 entries keeps after
// they are deleted is given back by the copy.
func TestMapFreesBuckets(t *testing.T) {
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := heap()
	m, peak := map[int][64]byte{}, 0
	for i := range 100_000 {
		m[i] = [64]byte{}
	}
	kept := m
	for i := range 100_000 {
		delete(kept, i)
	}
	held := heap() - base
	runtime.KeepAlive(kept) // live while held was measured
	m = map[int][64]byte{}
	for i := range 100_000 {
		m[i] = [64]byte{}
	}
	kept = nil
	for i := range 100_000 {
		delete(m, i)
		m = Map(m, &peak)
	}
	after := heap() - min(base, heap())
	runtime.KeepAlive(m)
	if held < 4<<20 || after > held/10 {
		t.Errorf("a map emptied without Map kept %d bytes, one emptied with it %d", held, after)
	}
}

func sameMap(a, b map[int]int) bool {
	a[-1] = 1
	defer delete(a, -1)
	_, ok := b[-1]
	return ok
}
