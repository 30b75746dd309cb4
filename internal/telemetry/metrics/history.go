package metrics

import (
	"math"
	"time"
	"unsafe"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Tier is one resolution of the history: a point every Resolution, kept
// for Span. The first tier keeps every sample (its Resolution is the
// sampler's interval); each later tier folds the samples of a Resolution
// into one point.
type Tier struct {
	Resolution time.Duration
	Span       time.Duration
}

// DefaultTiers: 1 s for 15 minutes, 1 minute for 24 hours, 15 minutes for
// 7 days.
var DefaultTiers = []Tier{
	{time.Second, 15 * time.Minute},
	{time.Minute, 24 * time.Hour},
	{15 * time.Minute, 7 * 24 * time.Hour},
}

func (t Tier) points() int { return int(t.Span / t.Resolution) }

func validateTiers(tiers []Tier, interval time.Duration) error {
	if len(tiers) == 0 {
		return errdefs.Invalid("tiers", "need at least one")
	}
	if tiers[0].Resolution != interval {
		return errdefs.Invalid("tiers", "the first tier's resolution %v must be the interval %v", tiers[0].Resolution, interval)
	}
	for i, t := range tiers {
		if t.Resolution <= 0 || t.Span < t.Resolution || t.points() > 1<<20 {
			return errdefs.Invalid("tiers", "tier %d: resolution %v and span %v make no sense", i, t.Resolution, t.Span)
		}
		// A coarse point is folded when its interval ends; until then
		// the finer tier must still hold the samples it will cover.
		if i > 0 && (t.Resolution <= tiers[i-1].Resolution || tiers[i-1].Span < t.Resolution) {
			return errdefs.Invalid("tiers", "tier %d: resolution %v must be above %v and at most the span %v before it",
				i, t.Resolution, tiers[i-1].Resolution, tiers[i-1].Span)
		}
	}
	return nil
}

// point is a Sample as the history stores it: 88 bytes instead of the
// Sample's 150-odd. Memory is kept in KiB (the kernel charges pages),
// the disk cap in MiB; all saturate rather than wrap.
type point struct {
	t          int64 // unix nanoseconds
	cpu        uint64
	throttled  uint64
	rx, tx     uint64
	diskUsed   int64
	memKiB     uint32
	peakKiB    uint32
	limitKiB   uint32
	pids       uint32
	pidsLimit  uint32
	allowed    uint32
	denied     uint32
	oom        uint32
	diskCapMiB uint32
	cpuPct     float32
}

func sat32(v uint64) uint32 {
	if v > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(v)
}

func nonneg(v int64) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

func kib(v int64) uint32 { return sat32((nonneg(v) + 1023) >> 10) }

func toPoint(t time.Time, r *Reading, cpuPct float64) point {
	return point{
		t:          t.UnixNano(),
		cpu:        r.CPUNanos,
		throttled:  r.CPUThrottledNanos,
		rx:         r.NetRxBytes,
		tx:         r.NetTxBytes,
		diskUsed:   r.DiskUsedBytes,
		memKiB:     kib(r.MemoryBytes),
		peakKiB:    kib(r.MemoryPeakBytes),
		limitKiB:   kib(r.MemoryLimitBytes),
		pids:       sat32(nonneg(r.Pids)),
		pidsLimit:  sat32(nonneg(r.PidsLimit)),
		allowed:    sat32(r.EgressAllowed),
		denied:     sat32(r.EgressDenied),
		oom:        sat32(r.OOMKills),
		diskCapMiB: sat32((nonneg(r.DiskBytes) + 1<<20 - 1) >> 20),
		cpuPct:     float32(cpuPct),
	}
}

func (p *point) sample() Sample {
	return Sample{Sample: api.Sample{
		Time:                time.Unix(0, p.t),
		CPUSeconds:          float64(p.cpu) / 1e9,
		CPUPercent:          float64(p.cpuPct),
		CPUThrottledSeconds: float64(p.throttled) / 1e9,
		MemoryBytes:         int64(p.memKiB) << 10,
		MemoryPeakBytes:     int64(p.peakKiB) << 10,
		MemoryLimitBytes:    int64(p.limitKiB) << 10,
		Pids:                int64(p.pids),
		PidsLimit:           int64(p.pidsLimit),
		DiskUsedBytes:       p.diskUsed,
		DiskBytes:           int64(p.diskCapMiB) << 20,
		NetRxBytes:          p.rx,
		NetTxBytes:          p.tx,
		EgressAllowed:       uint64(p.allowed),
		EgressDenied:        uint64(p.denied),
		OOMKills:            uint64(p.oom),
	}}
}

// fold accumulates the samples of one interval of a coarse tier.
type fold struct {
	bucket int64 // interval number: t / resolution
	n      int
	p      point   // the interval's last sample, with maxima folded in
	pctDt  float64 // sum of cpu% × seconds
	dt     float64 // seconds covered
}

// history is one sandbox's samples at every tier.
type history struct {
	res   []int64 // resolution of each tier, in ns
	rings []ring
	folds []fold // folds[i] feeds rings[i]; folds[0] is unused
}

func newHistory(tiers []Tier) *history {
	h := &history{
		res:   make([]int64, len(tiers)),
		rings: make([]ring, len(tiers)),
		folds: make([]fold, len(tiers)),
	}
	for i, t := range tiers {
		h.res[i] = int64(t.Resolution)
		h.rings[i].max = t.points()
	}
	return h
}

// tiers are h's tiers, for another history of the same shape.
func (h *history) tiers() []Tier {
	ts := make([]Tier, len(h.res))
	for i := range ts {
		ts[i] = Tier{Resolution: time.Duration(h.res[i]), Span: time.Duration(h.res[i]) * time.Duration(h.rings[i].max)}
	}
	return ts
}

// add records p; dt is the seconds since the previous sample (0 for the
// first), over which p.cpuPct was measured.
func (h *history) add(p point, dt float64) {
	h.rings[0].push(p)
	for i := 1; i < len(h.rings); i++ {
		f := &h.folds[i]
		b := p.t / h.res[i]
		if f.n > 0 && b != f.bucket {
			h.rings[i].push(f.point())
			f.n = 0
		}
		if f.n == 0 {
			*f = fold{bucket: b, n: 1, p: p, pctDt: float64(p.cpuPct) * dt, dt: dt}
			continue
		}
		peakMem, peakPids := max(f.p.memKiB, p.memKiB), max(f.p.pids, p.pids)
		f.p = p
		f.p.memKiB, f.p.pids = peakMem, peakPids
		f.pctDt += float64(p.cpuPct) * dt
		f.dt += dt
		f.n++
	}
}

func (f *fold) point() point {
	p := f.p
	if f.dt > 0 {
		p.cpuPct = float32(f.pctDt / f.dt)
	}
	return p
}

// query appends the samples in [from, to] to dst, oldest first, each
// time span from the finest tier that still covers it.
func (h *history) query(dst []Sample, from, to int64) []Sample {
	// Walk from the finest tier to the coarsest; each coarser tier only
	// fills in before the oldest point of the finer ones.
	hi := to
	if hi < math.MaxInt64 {
		hi++ // exclusive
	}
	ends := make([]int64, len(h.rings)) // per tier: the end of its range
	for i := range h.rings {
		r := &h.rings[i]
		ends[i] = hi
		if r.len() > 0 {
			hi = min(hi, r.oldest())
		}
	}
	for i := len(h.rings) - 1; i >= 0; i-- {
		dst = h.rings[i].appendRange(dst, from, ends[i])
	}
	return dst
}

// bytes is the memory the history takes.
func (h *history) bytes() int {
	n := int(unsafe.Sizeof(*h)) + len(h.res)*8 + len(h.rings)*int(unsafe.Sizeof(ring{})) + len(h.folds)*int(unsafe.Sizeof(fold{}))
	for i := range h.rings {
		n += h.rings[i].bytes()
	}
	return n
}
