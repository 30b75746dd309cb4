package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"
)

// trimEvery is how often trimMemory looks at the sandbox count.
const trimEvery = 2 * time.Second

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
// trimEvery, and only after such a fall); see trimmer for when. Before
// that, release is called to give back what is not the Go heap's (the
// store's mapped pages).
func trimMemory(ctx context.Context, count func() int, release func() error, log *slog.Logger) {
	t := time.NewTicker(trimEvery)
	defer t.Stop()
	tr := newTrimmer(count())
	base := threads()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := count()
		if tr.tick(n) {
			if err := release(); err != nil {
				log.Warn("returning freed memory to the host", "err", err)
			}
			reaped := reapThreads(threads() - base)
			debug.FreeOSMemory()
			log.Debug("returned freed memory to the host", "sandboxes", n, "threads_ended", reaped)
		}
	}
}

// trimmer decides, from the sandbox count at each tick, when freed
// memory is returned: once the count has fallen to half of its peak
// since the last trim, and by trimMin; and, from then until the count
// grows again, whenever it stops after falling (the count is the same
// two ticks running), because what the last sandboxes held is freed
// only when their teardowns, which run behind the deletes, are over.
// Without that a daemon whose thousand sandboxes were removed kept the
// last few hundred's garbage and pages (+53% RSS, issue 21); and with
// only one such trim, the first pause of a slow teardown took it, and
// the garbage of the rest stayed. Once the count has stopped, the next
// trimTail ticks trim again while it stays: what goes on behind the last
// teardowns (the network slots' resets, the telemetry's last writes)
// frees more after the count is final, and the runtime keeps that
// garbage and its pages until a collection it may not start for minutes
// (a thousand sandboxes removed: 1.3 MiB of idle heap and 0.7 MiB of
// garbage still held 10 s after the last, +14% RSS, issue 21).
type trimmer struct {
	peak  int  // the highest count since the last trim
	prev  int  // the count at the last tick
	owed  bool // a fall was trimmed, and the count has not grown since
	dirty bool // the count fell since the last trim
	tail  int  // trims left while the count stays where it stopped
}

// trimTail is how many ticks after a stop trim again.
const trimTail = 3

func newTrimmer(n int) *trimmer { return &trimmer{peak: n, prev: n} }

// tick takes the count and reports whether to trim now.
func (t *trimmer) tick(n int) bool {
	defer func() { t.prev = n }()
	t.peak = max(t.peak, n)
	switch {
	case n < t.peak/2 && t.peak-n >= trimMin:
		t.peak, t.owed, t.dirty = n, true, true
		return true
	case n > t.prev:
		t.owed, t.tail = false, 0 // growing again: the next fall is judged afresh
	case n < t.prev:
		t.dirty = true
	case t.owed && t.dirty:
		t.peak, t.dirty, t.tail = n, false, trimTail
		return true
	case t.tail > 0:
		t.tail--
		return true
	}
	return false
}

// threads is the process's thread count (0 if it cannot be read).
func threads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	_, rest, ok := bytes.Cut(b, []byte("\nThreads:"))
	if !ok {
		return 0
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	n, _ := strconv.Atoi(string(bytes.TrimSpace(line)))
	return n
}

// reapThreads ends up to n of the Go runtime's idle threads, and
// returns how many fewer threads the process has. The runtime keeps
// every thread it ever made for a blocking call, each with its signal
// stack and the pages its C stack touched: a daemon that served a
// thousand sandboxes kept some twenty more threads, about 100 KiB of
// RSS each, after they were gone (issue 21). A goroutine that exits
// locked to its thread ends the thread; the processor it ran on goes to
// an idle thread, so each such goroutine costs one idle thread. With
// none idle the runtime makes one, and the count stays.
func reapThreads(n int) int {
	before := threads()
	for range n {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(done)
			// Returns locked: the runtime ends the thread.
		}()
		<-done
	}
	if n <= 0 {
		return 0
	}
	// The last thread ends after its goroutine has said so.
	time.Sleep(10 * time.Millisecond)
	return before - threads()
}
