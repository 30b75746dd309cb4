package hub

import (
	"sync"
	"time"

	"paddock/internal/telemetry/execlog"
	"paddock/wire"
)

// batchDelay is how long copied output may wait in memory before it is
// written to the exec log.
const batchDelay = time.Second

// batch holds a process's newest output in memory and writes it to the
// exec log at most once a batchDelay (and at the exit). The log keeps only
// a process's newest bytes, so output that newer output pushes past that
// cap while waiting is counted as skipped and never written: a fast
// stream costs the log a bounded amount of disk work per second, not a
// copy of every byte.
type batch struct {
	w    *execlog.Writer
	keep int64 // the log's cap on one process's output

	mu      sync.Mutex
	skip    int64     // bytes before frames that will not be written
	frames  []relayed // stdout and stderr, oldest first
	held    int64     // bytes in frames
	timer   *time.Timer
	err     error // the first write error; the batch writes no more
	stopped bool
}

func newBatch(w *execlog.Writer, keep int64) *batch {
	return &batch{w: w, keep: keep}
}

// add queues output of one stream.
func (b *batch) add(t wire.Type, p []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frames = append(b.frames, relayed{t, p})
	b.held += int64(len(p))
	for len(b.frames) > 1 && b.held-int64(len(b.frames[0].p)) >= b.keep {
		n := int64(len(b.frames[0].p))
		b.skip += n
		b.held -= n
		b.frames[0] = relayed{}
		b.frames = b.frames[1:]
	}
	if b.timer == nil && !b.stopped {
		b.timer = time.AfterFunc(batchDelay, func() { b.flush() })
	}
}

// dropped records n bytes the copy never saw (the guest's buffer had
// moved on).
func (b *batch) dropped(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.writeLocked()
	b.skip += n
}

// flush writes what is held; it returns the first write error.
func (b *batch) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.writeLocked()
}

// stop flushes and ends the timer: nothing is written after it returns.
func (b *batch) stop() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	return b.writeLocked()
}

func (b *batch) writeLocked() error {
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	if b.err != nil {
		return b.err
	}
	if b.skip > 0 {
		b.w.Skip(b.skip)
		b.skip = 0
	}
	for _, f := range b.frames {
		if err := b.w.Write(f.t, f.p); err != nil {
			b.err = err
			break
		}
	}
	b.frames, b.held = nil, 0
	return b.err
}
