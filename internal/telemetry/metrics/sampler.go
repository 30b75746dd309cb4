package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/shrink"
)

// Observer is told every sample a tick takes, after the tick has stored
// them all, on the sampler's goroutine: it must not block (start slow work
// in a goroutine of its own).
type Observer interface {
	Observe(id string, s Sample)
}

// Config configures a Sampler.
type Config struct {
	// Interval is the time between ticks. Default 1 s.
	Interval time.Duration
	// Tiers of the history; the first tier's Resolution must be Interval.
	// Default DefaultTiers (with the first resolution set to Interval).
	Tiers []Tier
	// Observers are called in order with each sample.
	Observers []Observer
	// Logger; nil discards.
	Logger *slog.Logger
}

// Totals are counters over every sandbox the sampler has watched, for the
// fleet-wide Prometheus counters: they only grow, whatever sandboxes come
// and go. Each counts what was used between two samples of a sandbox.
type Totals struct {
	CPUSeconds          float64
	CPUThrottledSeconds float64
	NetRxBytes          uint64
	NetTxBytes          uint64
	EgressAllowed       uint64
	EgressDenied        uint64
	OOMKills            uint64
}

// Latest is a sandbox's most recent sample.
type Latest struct {
	ID     string
	Sample Sample
}

// Sampler reads every registered sandbox once per interval, on one
// goroutine, and keeps their histories. Its methods are safe for
// concurrent use.
type Sampler struct {
	cfg Config
	log *slog.Logger

	mu         sync.Mutex
	series     map[string]*series
	seriesPeak int // for shrink.Map
	totals     Totals
	retired    []Source // unregistered; closed by the next tick

	tickMu sync.Mutex // one tick at a time; guards the buffers below
	batch  []sourced
	seen   []Latest

	lastTick    atomic.Int64 // ns the last tick took
	lastSampled atomic.Int64
}

type sourced struct {
	se  *series
	src Source
}

// series is one sandbox: its source while it runs, and its history.
type series struct {
	id  string
	src Source // nil once unregistered; written under Sampler.mu

	mu      sync.Mutex
	hist    *history
	last    Sample // the latest sample, with the autoscaler's inputs
	prev    Reading
	prevT   int64 // ns; 0: no reading yet since (re-)registration
	errLogT time.Time
	// parts are the containers of a sandbox of several, by name: their
	// histories outlive a source, as the sandbox's does.
	parts map[string]*part
}

// part is one container's share of a series.
type part struct {
	hist  *history
	prev  Reading
	prevT int64
}

// NewSampler returns a Sampler; call Run to start it ticking.
func NewSampler(cfg Config) (*Sampler, error) {
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Interval < time.Millisecond {
		return nil, errdefs.Invalid("interval", "must be at least 1ms, got %v", cfg.Interval)
	}
	if cfg.Tiers == nil {
		cfg.Tiers = append([]Tier(nil), DefaultTiers...)
		cfg.Tiers[0].Resolution = cfg.Interval
		if cfg.Tiers[0].Span < 900*cfg.Interval {
			cfg.Tiers[0].Span = 900 * cfg.Interval
		}
	}
	if err := validateTiers(cfg.Tiers, cfg.Interval); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sampler{cfg: cfg, log: cfg.Logger, series: map[string]*series{}}, nil
}

// Run ticks every interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.Tick(now)
		}
	}
}

// Register starts sampling sandbox id from src. Registering an id again
// (a sandbox started again, or re-attached after a daemon restart) keeps
// its history and swaps the source.
func (s *Sampler) Register(id string, src Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.series[id]
	if se == nil {
		se = &series{id: id, hist: newHistory(s.cfg.Tiers)}
		s.series[id] = se
	}
	s.retire(se.src)
	se.src = src
	se.mu.Lock()
	se.prevT = 0 // the new source's counters start afresh
	for _, p := range se.parts {
		p.prevT = 0
	}
	se.mu.Unlock()
}

// Unregister stops sampling id and keeps its history (a stopped sandbox
// can still be asked how it ended). The sampler closes the source, if it
// is an io.Closer, once no tick uses it.
func (s *Sampler) Unregister(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if se := s.series[id]; se != nil {
		s.retire(se.src)
		se.src = nil
	}
}

// Forget drops id and its history (the sandbox was deleted).
func (s *Sampler) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if se := s.series[id]; se != nil {
		s.retire(se.src)
		delete(s.series, id)
		s.series = shrink.Map(s.series, &s.seriesPeak)
	}
}

func (s *Sampler) retire(src Source) {
	if _, ok := src.(io.Closer); ok {
		s.retired = append(s.retired, src)
	}
}

// closeRetired closes the sources no tick uses any more; the caller holds
// tickMu.
func (s *Sampler) closeRetired() {
	s.mu.Lock()
	retired := s.retired
	s.retired = nil
	s.mu.Unlock()
	for _, src := range retired {
		if err := src.(io.Closer).Close(); err != nil {
			s.log.Warn("closing metrics source", "err", err)
		}
	}
}

// Close unregisters every sandbox and closes their sources. Call it after
// Run has returned.
func (s *Sampler) Close() {
	s.tickMu.Lock()
	defer s.tickMu.Unlock()
	s.mu.Lock()
	for _, se := range s.series {
		s.retire(se.src)
		se.src = nil
	}
	s.mu.Unlock()
	s.closeRetired()
}

func (s *Sampler) get(id string) (*series, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se := s.series[id]
	if se == nil {
		return nil, errdefs.NotFound("metrics of sandbox", id)
	}
	return se, nil
}

// Current returns id's latest sample. ok is false if it was never sampled.
func (s *Sampler) Current(id string) (smp Sample, ok bool, err error) {
	se, err := s.get(id)
	if err != nil {
		return Sample{}, false, err
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	return se.last, !se.last.Time.IsZero(), nil
}

// History returns id's samples between from and to, inclusive, oldest
// first. The last 15 minutes come at the sampling interval, older ones at
// the coarser tiers' resolutions (see Sample).
func (s *Sampler) History(id string, from, to time.Time) ([]Sample, error) {
	se, err := s.get(id)
	if err != nil {
		return nil, err
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	return se.hist.query(nil, from.UnixNano(), to.UnixNano()), nil
}

// ContainerHistory is History for container name of a sandbox of several
// containers, and its latest sample (ok false if it has none).
func (s *Sampler) ContainerHistory(id, name string, from, to time.Time) (cur api.ContainerSample, ok bool, hist []Sample, err error) {
	se, err := s.get(id)
	if err != nil {
		return cur, false, nil, err
	}
	se.mu.Lock()
	defer se.mu.Unlock()
	p := se.parts[name]
	if p == nil {
		return cur, false, nil, errdefs.NotFound("metrics of container", name)
	}
	for _, c := range se.last.Containers {
		if c.Name == name {
			cur, ok = c, true
		}
	}
	return cur, ok, p.hist.query(nil, from.UnixNano(), to.UnixNano()), nil
}

// Running returns the latest sample of every sandbox being sampled,
// appended to dst.
func (s *Sampler) Running(dst []Latest) []Latest {
	s.mu.Lock()
	list := make([]*series, 0, len(s.series))
	for _, se := range s.series {
		if se.src != nil {
			list = append(list, se)
		}
	}
	s.mu.Unlock()
	for _, se := range list {
		se.mu.Lock()
		if !se.last.Time.IsZero() {
			dst = append(dst, Latest{ID: se.id, Sample: se.last})
		}
		se.mu.Unlock()
	}
	return dst
}

// Totals returns the fleet-wide counters.
func (s *Sampler) Totals() Totals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.totals
}

// LastTick reports how long the last tick took (wall time, an upper bound
// on its CPU time) and how many sandboxes it sampled.
func (s *Sampler) LastTick() (time.Duration, int) {
	return time.Duration(s.lastTick.Load()), int(s.lastSampled.Load())
}

// Tick samples every registered sandbox as of now, stores the samples and
// tells the observers. Run calls it; tests may call it directly.
func (s *Sampler) Tick(now time.Time) {
	s.tickMu.Lock()
	defer s.tickMu.Unlock()
	start := time.Now()
	s.closeRetired()

	s.mu.Lock()
	s.batch = s.batch[:0]
	for _, se := range s.series {
		if se.src != nil {
			s.batch = append(s.batch, sourced{se, se.src})
		}
	}
	s.mu.Unlock()

	s.seen = s.seen[:0]
	var d Totals
	for i := range s.batch {
		se := s.batch[i].se
		r, err := s.batch[i].src.Read()
		if err != nil {
			s.readFailed(se, now, err)
			continue
		}
		s.seen = append(s.seen, Latest{ID: se.id, Sample: se.record(now, &r, &d)})
	}
	s.mu.Lock()
	s.totals.add(&d)
	s.mu.Unlock()
	for i := range s.seen {
		for _, o := range s.cfg.Observers {
			o.Observe(s.seen[i].ID, s.seen[i].Sample)
		}
	}
	clear(s.batch) // let unregistered sources go
	s.lastTick.Store(int64(time.Since(start)))
	s.lastSampled.Store(int64(len(s.seen)))
	// The buffers kept for the next tick are let go once they are four
	// times what a tick needs: a thousand sandboxes' took 250 KiB after
	// they were gone (issue 21).
	if cap(s.seen) > 64 && len(s.seen) < cap(s.seen)/4 {
		s.batch, s.seen = nil, nil
	}
}

func (s *Sampler) readFailed(se *series, now time.Time, err error) {
	if errors.Is(err, errdefs.ErrNotFound) {
		return // stopping: the manager will unregister it
	}
	se.mu.Lock()
	quiet := now.Sub(se.errLogT) < time.Minute
	if !quiet {
		se.errLogT = now
	}
	se.mu.Unlock()
	if !quiet {
		s.log.Warn("reading sandbox metrics", "sandbox", se.id, "err", err)
	}
}

// record stores reading r taken at now and adds what was used since the
// previous reading to d.
func (se *series) record(now time.Time, r *Reading, d *Totals) Sample {
	se.mu.Lock()
	defer se.mu.Unlock()
	t := now.UnixNano()
	var (
		pct, dt float64
		p       = &se.prev
	)
	if se.prevT != 0 && t > se.prevT {
		dt = float64(t-se.prevT) / 1e9
		cpu := delta(p.CPUNanos, r.CPUNanos)
		pct = float64(cpu) / 1e9 / dt * 100
		d.CPUSeconds += float64(cpu) / 1e9
		d.CPUThrottledSeconds += float64(delta(p.CPUThrottledNanos, r.CPUThrottledNanos)) / 1e9
		d.NetRxBytes += delta(p.NetRxBytes, r.NetRxBytes)
		d.NetTxBytes += delta(p.NetTxBytes, r.NetTxBytes)
		d.EgressAllowed += delta(p.EgressAllowed, r.EgressAllowed)
		d.EgressDenied += delta(p.EgressDenied, r.EgressDenied)
		d.OOMKills += delta(p.OOMKills, r.OOMKills)
	}
	pt := toPoint(now, r, pct)
	se.hist.add(pt, dt)
	se.prev, se.prevT = *r, t
	se.last = pt.sample()
	se.last.Time = now // keep the monotonic reading and location
	// Exact values for the latest sample; the history rounds.
	se.last.MemoryBytes, se.last.MemoryPeakBytes, se.last.MemoryLimitBytes = r.MemoryBytes, r.MemoryPeakBytes, r.MemoryLimitBytes
	se.last.DiskBytes, se.last.EgressAllowed, se.last.EgressDenied, se.last.OOMKills = r.DiskBytes, r.EgressAllowed, r.EgressDenied, r.OOMKills
	se.last.CPUPercent = pct
	se.last.MemoryFailcnt = r.MemoryFailcnt
	se.last.MemoryStallSeconds = float64(r.MemoryStallNanos) / 1e9
	se.last.MemoryReclaimableBytes = r.MemoryReclaimableBytes
	se.last.Containers = se.recordParts(now, r.Containers)
	return se.last
}

// recordParts stores the containers' readings taken at now and returns
// their samples. Their usage is in the sandbox's already: nothing is
// added to the totals.
func (se *series) recordParts(now time.Time, rs []ContainerReading) []api.ContainerSample {
	if len(rs) == 0 {
		return nil
	}
	if se.parts == nil {
		se.parts = make(map[string]*part, len(rs))
	}
	t := now.UnixNano()
	out := make([]api.ContainerSample, len(rs))
	for i := range rs {
		r := &rs[i]
		p := se.parts[r.Name]
		if p == nil {
			p = &part{hist: newHistory(se.hist.tiers())}
			se.parts[r.Name] = p
		}
		var pct, dt float64
		if p.prevT != 0 && t > p.prevT {
			dt = float64(t-p.prevT) / 1e9
			pct = float64(delta(p.prev.CPUNanos, r.CPUNanos)) / 1e9 / dt * 100
		}
		pt := toPoint(now, &r.Reading, pct)
		p.hist.add(pt, dt)
		p.prev, p.prevT = r.Reading, t
		smp := pt.sample().Sample
		smp.Time = now
		smp.MemoryBytes, smp.MemoryPeakBytes, smp.MemoryLimitBytes = r.MemoryBytes, r.MemoryPeakBytes, r.MemoryLimitBytes
		smp.DiskBytes, smp.OOMKills, smp.CPUPercent = r.DiskBytes, r.OOMKills, pct
		out[i] = api.ContainerSample{Name: r.Name, Sample: smp}
	}
	return out
}

// delta is what a cumulative counter grew by; a counter that went down was
// reset, and counts from zero.
func delta(prev, cur uint64) uint64 {
	if cur >= prev {
		return cur - prev
	}
	return cur
}

func (t *Totals) add(d *Totals) {
	t.CPUSeconds += d.CPUSeconds
	t.CPUThrottledSeconds += d.CPUThrottledSeconds
	t.NetRxBytes += d.NetRxBytes
	t.NetTxBytes += d.NetTxBytes
	t.EgressAllowed += d.EgressAllowed
	t.EgressDenied += d.EgressDenied
	t.OOMKills += d.OOMKills
}
