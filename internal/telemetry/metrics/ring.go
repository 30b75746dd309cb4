package metrics

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// chunkPoints is how many points a chunk of a ring codes. Each chunk
// starts afresh, so that the oldest can be dropped whole; a ring holds up
// to chunkPoints-1 points more than its tier keeps, and hides them.
const chunkPoints = 64

// pointFields is how many fields of a point follow its time.
const pointFields = 15

// fields returns p's fields after its time as unsigned integers, in a
// fixed order, for delta coding. Signed and float fields keep their bits.
func (p *point) fields() [pointFields]uint64 {
	return [pointFields]uint64{
		p.cpu, p.throttled, p.rx, p.tx, uint64(p.diskUsed),
		uint64(p.memKiB), uint64(p.peakKiB), uint64(p.limitKiB), uint64(p.pids), uint64(p.pidsLimit),
		uint64(p.allowed), uint64(p.denied), uint64(p.oom), uint64(p.diskCapMiB),
		uint64(math.Float32bits(p.cpuPct)),
	}
}

func (p *point) setFields(f *[pointFields]uint64) {
	p.cpu, p.throttled, p.rx, p.tx, p.diskUsed = f[0], f[1], f[2], f[3], int64(f[4])
	p.memKiB, p.peakKiB, p.limitKiB, p.pids, p.pidsLimit = uint32(f[5]), uint32(f[6]), uint32(f[7]), uint32(f[8]), uint32(f[9])
	p.allowed, p.denied, p.oom, p.diskCapMiB = uint32(f[10]), uint32(f[11]), uint32(f[12]), uint32(f[13])
	p.cpuPct = math.Float32frombits(uint32(f[14]))
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// pctField is the field of CPU%, which is coded as its difference from
// the CPU% between the point before and this one, as the sampler works it
// out: none for a 1 s point, a few units in the last place for a folded
// one.
const pctField = pointFields - 1

// derivedPct is the CPU% from prev to a point at t whose CPU counter is
// cpu, worked out as series.record does.
func derivedPct(prev *point, t int64, cpu uint64) uint64 {
	var pct float64
	if t > prev.t {
		pct = float64(delta(prev.cpu, cpu)) / 1e9 / (float64(t-prev.t) / 1e9) * 100
	}
	return uint64(math.Float32bits(float32(pct)))
}

// appendPoint codes p after prev, whose time was step after the point
// before it: the change of step (a ticker's jitter, for a steady series),
// a mask of the fields that changed, and the change of each. An idle
// sandbox's point takes about 4 bytes; the most any point takes is 113
// (10 for the time, 3 for the mask, 10 for each 64-bit field, 5 for each
// 32-bit one). Arithmetic wraps, so every value codes and decodes exactly.
func appendPoint(b []byte, prev *point, step int64, p *point) []byte {
	b = binary.AppendUvarint(b, zigzag(p.t-prev.t-step))
	pf, f := prev.fields(), p.fields()
	pf[pctField] = derivedPct(prev, p.t, p.cpu)
	var mask uint64
	for i := range f {
		if f[i] != pf[i] {
			mask |= 1 << i
		}
	}
	b = binary.AppendUvarint(b, mask)
	for i := range f {
		if mask&(1<<i) != 0 {
			b = binary.AppendUvarint(b, zigzag(int64(f[i]-pf[i])))
		}
	}
	return b
}

// cursor decodes a chunk, point by point.
type cursor struct {
	b    []byte
	p    point
	step int64
}

func (c *cursor) uvarint() uint64 {
	v, n := binary.Uvarint(c.b)
	c.b = c.b[n:]
	return v
}

// next decodes the next point into c.p.
func (c *cursor) next() {
	prev := c.p
	c.step += unzigzag(c.uvarint())
	c.p.t += c.step
	mask := c.uvarint()
	f := prev.fields()
	for i := range f {
		if i == pctField {
			f[i] = derivedPct(&prev, c.p.t, f[0])
		}
		if mask&(1<<i) != 0 {
			f[i] += uint64(unzigzag(c.uvarint()))
		}
	}
	c.p.setFields(&f)
}

// chunk is up to chunkPoints points, each coded after the one before; the
// first after a point of zeros at time first.
type chunk struct {
	b           []byte
	n           int
	first, last int64 // times of the first and last points
}

func (c *chunk) cursor() cursor { return cursor{b: c.b, p: point{t: c.first}} }

// ring keeps the last max points, coded in chunks. A short-lived sandbox
// pays only for the chunks it filled.
type ring struct {
	chunks []chunk
	n      int // points in chunks
	max    int
	prev   point // the newest point, which the next is coded after
	step   int64 // prev.t less the time of the point before it
}

func (r *ring) push(p point) {
	if len(r.chunks) == 0 || r.chunks[len(r.chunks)-1].n == chunkPoints {
		if len(r.chunks) > 0 {
			c := &r.chunks[len(r.chunks)-1]
			c.b = append(make([]byte, 0, len(c.b)), c.b...) // drop append's slack
		}
		r.chunks = append(r.chunks, chunk{first: p.t})
		r.prev, r.step = point{t: p.t}, 0
	}
	c := &r.chunks[len(r.chunks)-1]
	c.b = appendPoint(c.b, &r.prev, r.step, &p)
	c.n++
	c.last = p.t
	r.n++
	r.prev, r.step = p, p.t-r.prev.t
	if r.n-r.chunks[0].n >= r.max {
		r.n -= r.chunks[0].n
		copy(r.chunks, r.chunks[1:])
		r.chunks[len(r.chunks)-1] = chunk{}
		r.chunks = r.chunks[:len(r.chunks)-1]
	}
}

func (r *ring) len() int { return min(r.n, r.max) }

// hidden is how many of the first chunk's points are past the tier's
// span: fewer than the chunk holds, or push would have dropped it.
func (r *ring) hidden() int { return max(r.n-r.max, 0) }

// oldest returns the time of the oldest point kept; the ring must not be
// empty.
func (r *ring) oldest() int64 {
	c := r.chunks[0].cursor()
	for range r.hidden() + 1 {
		c.next()
	}
	return c.p.t
}

// appendRange appends the samples at from ≤ t < to to dst, oldest first.
func (r *ring) appendRange(dst []Sample, from, to int64) []Sample {
	for i := range r.chunks {
		ch := &r.chunks[i]
		if ch.last < from {
			continue
		}
		if ch.first >= to {
			break
		}
		skip := 0
		if i == 0 {
			skip = r.hidden()
		}
		c := ch.cursor()
		for j := range ch.n {
			c.next()
			if j >= skip && c.p.t >= from && c.p.t < to {
				dst = append(dst, c.p.sample())
			}
		}
	}
	return dst
}

// bytes is the memory the ring takes beyond its own struct.
func (r *ring) bytes() int {
	n := cap(r.chunks) * int(unsafe.Sizeof(chunk{}))
	for i := range r.chunks {
		n += cap(r.chunks[i].b)
	}
	return n
}
