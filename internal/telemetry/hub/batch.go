package hub

import (
	"time"

	"github.com/paddock-dev/paddock/wire"
)

// batchDelay is how long copied output may wait in memory before it is
// written to the exec log.
const batchDelay = time.Second

// spanKind says where a span's bytes are.
type spanKind uint8

const (
	spanData  spanKind = iota // in hand (p)
	spanFetch                 // in the guest's output ring: fetched when written
	spanLost                  // lost before the copy saw them (the guest's ring had dropped them)
)

// span is a stretch of a process's output waiting in a batch.
type span struct {
	kind spanKind
	t    wire.Type // spanData: wire.Stdout or wire.Stderr
	off  int64     // offset of the first byte in the process's output
	n    int64
	p    []byte // spanData: the bytes, len n
}

// batch is what one process's copy holds between two writes to the exec
// log: its output since the last write, as spans in offset order, cut to
// the newest keep bytes. The log keeps only a process's newest bytes, so
// output that newer output pushes past that cap before the write is
// counted (skip) and never written. Not every byte is in hand: output the
// copy only counted is fetched from the guest's output ring when the
// batch is written, and only what the cap leaves of it; so a fast stream
// costs the copy no more than the cap a second, however much it carries.
//
// A batch belongs to the copy's goroutine.
type batch struct {
	keep   int64 // the log's cap on one process's output
	logged int64 // offset the log has reached (written or skipped)
	skip   int64 // bytes after logged that will not be written
	end    int64 // offset after the last span
	spans  []span
}

func newBatch(logged, keep int64) *batch {
	return &batch{keep: keep, logged: logged, end: logged}
}

// empty reports whether the batch has nothing to write.
func (b *batch) empty() bool { return b.end == b.logged }

// add adds bytes in hand at offset off (the caller must not modify p
// afterwards). Bytes before the batch's end are already accounted for
// (counted, to be fetched) and are left out.
func (b *batch) add(t wire.Type, off int64, p []byte) {
	if cut := b.end - off; cut > 0 {
		if cut >= int64(len(p)) {
			return
		}
		p, off = p[cut:], b.end
	}
	b.extend(spanFetch, off)
	n := int64(len(p))
	b.spans = append(b.spans, span{kind: spanData, t: t, off: off, n: n, p: p})
	b.end = off + n
	b.trim()
}

// fetch counts the output up to offset to, which the batch fetches from
// the guest when it is written.
func (b *batch) fetch(to int64) {
	b.extend(spanFetch, to)
	b.trim()
}

// lost counts the output up to offset to as lost (never in the guest's
// ring for the copy).
func (b *batch) lost(to int64) {
	b.extend(spanLost, to)
	b.trim()
}

// extend covers the batch's end up to offset to with a span of kind k,
// growing the last span if it is of that kind.
func (b *batch) extend(k spanKind, to int64) {
	if to <= b.end {
		return
	}
	if i := len(b.spans) - 1; k != spanData && i >= 0 && b.spans[i].kind == k {
		b.spans[i].n += to - b.end
	} else {
		b.spans = append(b.spans, span{kind: k, off: b.end, n: to - b.end})
	}
	b.end = to
}

// trim cuts the oldest spans (or their oldest bytes) until the batch
// holds at most keep bytes.
func (b *batch) trim() {
	over := b.end - (b.logged + b.skip) - b.keep
	for over > 0 && len(b.spans) > 0 {
		s := &b.spans[0]
		cut := min(over, s.n)
		b.skip += cut
		over -= cut
		if cut == s.n {
			b.spans[0] = span{}
			b.spans = b.spans[1:]
			continue
		}
		s.off += cut
		s.n -= cut
		if s.kind == spanData {
			s.p = s.p[cut:]
		}
	}
}

// take returns what to write: bytes to skip first, then the spans. With
// all unset it stops before the first span to fetch, which stays in the
// batch (the daemon is stopping: the next one fetches it, from the log's
// offset). The batch counts what it returns as logged.
func (b *batch) take(all bool) (skip int64, spans []span) {
	skip, spans = b.skip, b.spans
	b.skip = 0
	if !all {
		for i, s := range spans {
			if s.kind == spanFetch {
				b.spans = spans[i:]
				b.logged = s.off
				return skip, spans[:i]
			}
		}
	}
	b.spans = nil
	b.logged = b.end
	return skip, spans
}
