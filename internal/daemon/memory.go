package daemon

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// trimEvery is how often trimMemory looks at the heap.
const trimEvery = 10 * time.Second

// trimMemory gives the memory of sandboxes that are gone back to the
// host. The Go runtime keeps freed heap pages for reuse and its
// scavenger returns them slowly, down to about the heap goal, so after
// a mass removal the daemon held several MiB more than before it made
// them (issue 21: +4 MiB over a start of 26 MiB after 100 sandboxes
// came and went). When the live heap has fallen to half of its peak
// since the last trim, and by at least trimMin, the freed pages are
// returned at once (debug.FreeOSMemory: one forced collection, at most
// once per trimEvery, and only after such a drop).
func trimMemory(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	peak := liveHeap()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		live := liveHeap()
		peak = max(peak, live)
		if live < peak/2 && peak-live >= trimMin {
			debug.FreeOSMemory()
			log.Debug("returned freed memory to the host", "heap_peak", peak, "heap_live", live)
			peak = liveHeap()
		}
	}
}

// trimMin is the smallest drop of the live heap that trimMemory acts on.
const trimMin = 2 << 20

// liveHeap is the heap's bytes in live objects as of the last collection.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
