package daemon

import (
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestTrimmer(t *testing.T) {
	tests := []struct {
		name   string
		start  int
		counts []int
		trims  []int // indexes of counts at which a trim is due
	}{
		{"steady", 100, []int{100, 100, 100}, nil},
		{"growth", 0, []int{10, 500, 1000, 1000}, nil},
		{"a small fall", 30, []int{20, 16, 16}, nil},
		{"a fall to a half, then again once it stops, and trimTail ticks after", 1000, []int{900, 400, 400, 400, 400, 400, 400, 400}, []int{1, 2, 3, 4, 5}},
		{"a long fall, trimmed as it halves and after", 1000, []int{800, 450, 300, 100, 0, 0, 0, 0, 0, 0}, []int{1, 3, 4, 5, 6, 7, 8}},
		{"the tail of a fall below trimMin is trimmed when it stops", 1000, []int{400, 10, 0, 0}, []int{0, 1, 3}},
		{"growth between cancels the owed trim", 100, []int{40, 60, 60}, []int{0}},
		{"growth cancels the trims after a stop", 100, []int{40, 40, 41, 41, 41}, []int{0, 1}},
		{"each stop of a slow fall is trimmed", 1000, []int{400, 400, 300, 300, 5, 5, 0, 0, 0}, []int{0, 1, 3, 4, 5, 7, 8}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTrimmer(tc.start)
			var got []int
			for i, n := range tc.counts {
				if tr.tick(n) {
					got = append(got, i)
				}
			}
			if !slices.Equal(got, tc.trims) {
				t.Errorf("trims at %v, want %v", got, tc.trims)
			}
		})
	}
}

// reapThreads ends idle threads: those made for twenty goroutines
// locked to them at once, idle once those ended, are mostly gone after
// it.
func TestReapThreads(t *testing.T) {
	const n = 20
	before := threads()
	if before == 0 {
		t.Skip("no thread count in /proc/self/status")
	}
	var locked, release sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	for range n {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			locked.Done()
			release.Wait()
		}()
	}
	locked.Wait()
	release.Done()
	grown := threads()
	if grown < before+n/2 { // idle threads there before serve some
		t.Fatalf("threads %d → %d with %d goroutines locked to theirs", before, grown, n)
	}
	time.Sleep(50 * time.Millisecond) // the goroutines end, their threads idle
	extra := grown - before
	reaped := reapThreads(extra)
	if reaped < extra/2 {
		t.Errorf("reapThreads(%d) ended %d threads (%d → %d), want at least %d", extra, reaped, grown, threads(), extra/2)
	}
}
