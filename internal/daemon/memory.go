package daemon

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"
)

// trimEvery is how often trimMemory looks at the sandbox count.
const trimEvery = 5 * time.Second

// trimMin is the smallest fall in the sandbox count that trimMemory acts
// on.
const trimMin = 16

// trimMemory gives the memory of sandboxes that are gone back to the
// host. The Go runtime keeps freed heap pages for reuse and its
// scavenger returns them slowly, down to about the heap goal, and an
// idle daemon may not collect for minutes: after 100 sandboxes came and
// went the daemon held 4-13 MiB more than before it made them (issue
// 21). When the number of sandboxes (count) has fallen by half, and by at
// least trimMin, the freed pages are returned at once
// (debug.FreeOSMemory: one forced collection, at most once per
// trimEvery, and only after such a fall); see trimmer for when.
func trimMemory(ctx context.Context, count func() int, log *slog.Logger) {
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	tr := newTrimmer(count())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := count()
		if tr.tick(n) {
			debug.FreeOSMemory()
			log.Debug("returned freed memory to the host", "sandboxes", n)
		}
	}
}

// trimmer decides, from the sandbox count at each tick, when freed
// memory is returned: once the count has fallen to half of its peak
// since the last trim, and by trimMin; and once more when a fall that
// was trimmed stops (the count is the same two ticks running), because
// what the last sandboxes held is freed only when their teardowns,
// which run behind the deletes, are over. Without that second trim a
// daemon whose thousand sandboxes were removed kept the last few
// hundred's garbage and pages (+53% RSS, issue 21).
type trimmer struct {
	peak int  // the highest count since the last trim
	prev int  // the count at the last tick
	owed bool // a fall was trimmed while it went on
}

func newTrimmer(n int) *trimmer { return &trimmer{peak: n, prev: n} }

// tick takes the count and reports whether to trim now.
func (t *trimmer) tick(n int) bool {
	defer func() { t.prev = n }()
	t.peak = max(t.peak, n)
	switch {
	case n < t.peak/2 && t.peak-n >= trimMin:
		t.peak, t.owed = n, true
		return true
	case t.owed && n == t.prev:
		t.peak, t.owed = n, false
		return true
	case n > t.prev:
		t.owed = false // growing again: the next fall is judged afresh
	}
	return false
}
