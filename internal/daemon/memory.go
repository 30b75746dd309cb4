package daemon

import (
	"context"
	"log/slog"
	"runtime/debug"
	"time"
)

// trimEvery is how often trimMemory looks at the sandbox count.
const trimEvery = 10 * time.Second

// trimMin is the smallest fall in the sandbox count that trimMemory acts
// on.
const trimMin = 16

// trimMemory gives the memory of sandboxes that are gone back to the
// host. The Go runtime keeps freed heap pages for reuse and its
// scavenger returns them slowly, down to about the heap goal, and an
// idle daemon may not collect for minutes: after 100 sandboxes came and
// went the daemon held 4-13 MiB more than before it made them (issue
// 21). When the number of sandboxes (count) has fallen to half of its
// peak since the last trim, and by at least trimMin, the freed pages are
// returned at once (debug.FreeOSMemory: one forced collection, at most
// once per trimEvery, and only after such a fall).
func trimMemory(ctx context.Context, count func() int, log *slog.Logger) {
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	peak := count()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := count()
		peak = max(peak, n)
		if n < peak/2 && peak-n >= trimMin {
			debug.FreeOSMemory()
			log.Debug("returned freed memory to the host", "sandboxes_peak", peak, "sandboxes", n)
			peak = n
		}
	}
}
