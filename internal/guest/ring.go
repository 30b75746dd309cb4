package guest

import (
	"sync"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/wire"
)

// ring retains a process's output (stdout and stderr interleaved in the
// order they were read) up to a byte cap, oldest first out, so that a
// client can attach or re-attach at any offset the cap still holds.
//
// Offsets count output bytes since the process started. While a reader is
// attached and following, the writer waits rather than drop bytes that
// reader has not seen: an attached client gets flow control like a pipe;
// a process nobody watches never blocks.
type ring struct {
	mu      sync.Mutex
	cond    *sync.Cond
	chunks  []chunk
	start   int64 // offset of the first retained byte
	end     int64 // offset after the last byte
	max     int64
	dropped int64
	closed  bool // no more output will come
	exit    *api.ExitStatus
	readers map[*cursor]struct{}
}

type chunk struct {
	typ  wire.Type
	off  int64
	data []byte
}

// cursor is an attached reader's position.
type cursor struct{ off int64 }

func newRing(max int64) *ring {
	r := &ring{max: max, readers: map[*cursor]struct{}{}}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// newRingAt is a ring whose output starts at off: the bytes before it
// were lost to the cap before the ring was made (a process the fast
// guest handed over).
func newRingAt(max, off int64) *ring {
	r := newRing(max)
	r.start, r.end, r.dropped = off, off, off
	return r
}

// chunkSize is the size of the pumps' read buffers. A read that fills
// much of one is kept in the ring as it is (no copy) and the pump takes a
// fresh buffer; a short read is copied out so that a chatty process cannot
// pin a large buffer per line. Evicted buffers are recycled: fresh memory
// costs a page fault per 4 KiB, which on small VMs dominates streaming.
const (
	chunkSize = 256 << 10
	keepWhole = 32 << 10
	smallRead = 16 << 10
)

// freeChunks holds recycled read buffers. Unlike a sync.Pool it keeps
// them across garbage collections: a streaming process reuses the same
// few buffers instead of faulting in new ones.
var freeChunks = make(chan []byte, 32)

func getChunk() []byte {
	select {
	case b := <-freeChunks:
		return b
	default:
		return make([]byte, chunkSize)
	}
}

func putChunk(b []byte) {
	if cap(b) != chunkSize {
		return
	}
	select {
	case freeChunks <- b[:chunkSize]:
	default:
	}
}

// appendRead adds the first n bytes of buf, a buffer from getChunk, and
// returns the buffer the caller reads into next.
func (r *ring) appendRead(t wire.Type, buf []byte, n int) []byte {
	if n < keepWhole {
		r.append(t, append([]byte(nil), buf[:n]...))
		return buf
	}
	r.append(t, buf[:n])
	return getChunk()
}

// append adds output. data is kept; the caller must not reuse it.
func (r *ring) append(t wire.Type, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := int64(len(data))
	for r.blockedLocked(n) {
		r.cond.Wait()
	}
	r.chunks = append(r.chunks, chunk{typ: t, off: r.end, data: data})
	r.end += n
	for r.end-r.start > r.max && len(r.chunks) > 0 {
		// No attached reader still needs it (append waited for them).
		r.evictFirstLocked()
	}
	r.cond.Broadcast()
}

// evictFirstLocked drops the oldest chunk and returns its size.
func (r *ring) evictFirstLocked() int64 {
	c := r.chunks[0]
	r.chunks[0] = chunk{}
	r.chunks = r.chunks[1:]
	n := int64(len(c.data))
	r.start += n
	r.dropped += n
	putChunk(c.data)
	return n
}

// blockedLocked reports whether appending n bytes would evict bytes an
// attached reader has not read yet.
func (r *ring) blockedLocked(n int64) bool {
	if r.end+n-r.start <= r.max || len(r.chunks) == 0 {
		return false
	}
	// The bytes that would go: everything before newStart.
	newStart := r.end + n - r.max
	for c := range r.readers {
		if c.off < newStart && c.off < r.end {
			return true
		}
	}
	return false
}

// close marks the end of output with the process's exit status.
func (r *ring) close(st api.ExitStatus) {
	r.mu.Lock()
	r.closed = true
	r.exit = &st
	r.cond.Broadcast()
	r.mu.Unlock()
}

// retained is how many bytes the ring holds.
func (r *ring) retained() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end - r.start
}

// drop lets go of the output no attached reader still needs (what
// follows the first reader's position stays) and returns how many bytes
// went: a later attach gets a dropped frame for them.
func (r *ring) drop() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	keep := r.end
	for c := range r.readers {
		keep = min(keep, c.off)
	}
	var n int64
	for len(r.chunks) > 0 && r.chunks[0].off+int64(len(r.chunks[0].data)) <= keep {
		n += r.evictFirstLocked()
	}
	return n
}

// attach registers a reader at off (clamped to what is retained).
func (r *ring) attach(off int64) *cursor {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := &cursor{off: off}
	if c.off > r.end {
		c.off = r.end
	}
	r.readers[c] = struct{}{}
	return c
}

func (r *ring) detach(c *cursor) {
	r.mu.Lock()
	delete(r.readers, c)
	r.cond.Broadcast()
	r.mu.Unlock()
}

// next blocks until there is output past c, or the output has ended. It
// returns the chunks (sliced to start at c), how many bytes before c's
// position were lost to the cap, and the exit status once the end is reached.
// The returned chunks' data must not be modified. cancel or hold, when
// closed, makes next return (nil, 0, nil) (a waiter closes them and calls
// wake).
func (r *ring) next(c *cursor, cancel, hold <-chan struct{}) (out []chunk, lost int64, exit *api.ExitStatus) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c.off >= r.end && !r.closed {
		select {
		case <-cancel:
			return nil, 0, nil
		case <-hold:
			return nil, 0, nil
		default:
		}
		r.cond.Wait()
	}
	if c.off < r.start {
		lost = r.start - c.off
		c.off = r.start
	}
	for _, ch := range r.chunks {
		chEnd := ch.off + int64(len(ch.data))
		if chEnd <= c.off {
			continue
		}
		skip := c.off - ch.off
		if skip < 0 {
			skip = 0
		}
		out = append(out, chunk{typ: ch.typ, off: ch.off + skip, data: ch.data[skip:]})
	}
	return out, lost, r.exit
}

// advance moves c past the bytes it has delivered and wakes a blocked
// writer.
func (r *ring) advance(c *cursor, to int64) {
	r.mu.Lock()
	c.off = to
	r.cond.Broadcast()
	r.mu.Unlock()
}

// wake wakes every waiter so that cancelled readers notice.
func (r *ring) wake() {
	r.mu.Lock()
	r.cond.Broadcast()
	r.mu.Unlock()
}

func (r *ring) stats() (end, dropped int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.end, r.dropped
}
