// Package autoscale owns the decisions that make a sandbox's memory and
// CPU limits follow its workload: grow when it nears its limit, shrink
// back towards the minimum when it idles. It watches the sampler's
// samples; the daemon applies each decision with cgroup.Group.Update (the
// Apply callback), and every change becomes an event.
//
// Memory grows when any of these holds on a tick:
//   - the working set (usage less inactive page cache, which the kernel
//     can drop) passes GrowAt (85%) of the limit;
//   - tasks stalled on memory for StallAt (5%) of the tick (PSI "some",
//     cgroup v2);
//   - memory.failcnt rose while the working set is at least half the
//     limit (v1; cache alone also trips it);
//   - the OOM killer struck.
//
// It grows to GrowFactor (×1.5) the limit, or the working set plus
// headroom if that is more, up to the maximum. It shrinks when the
// working set plus headroom has stayed under ShrinkBelow (half) the limit
// for IdleFor, by GrowFactor at a time, never below the working set plus
// headroom nor the minimum. CPU follows the same shape on the quota,
// from the CPU use averaged over CPUWindow.
package autoscale

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// Range bounds a sandbox's limits. A resource whose Max is zero is not
// autoscaled.
type Range struct {
	MinMemoryBytes int64   `json:"min_memory_bytes,omitempty"`
	MaxMemoryBytes int64   `json:"max_memory_bytes,omitempty"`
	MinCPUs        float64 `json:"min_cpus,omitempty"`
	MaxCPUs        float64 `json:"max_cpus,omitempty"`
}

// Validate checks r.
func (r Range) Validate() error {
	switch {
	case r.MinMemoryBytes < 0 || r.MaxMemoryBytes < 0 || (r.MaxMemoryBytes > 0 && r.MinMemoryBytes > r.MaxMemoryBytes):
		return errdefs.Invalid("memory", "need 0 ≤ min ≤ max, got %d and %d", r.MinMemoryBytes, r.MaxMemoryBytes)
	case r.MaxMemoryBytes > 0 && r.MinMemoryBytes < 16<<20:
		return errdefs.Invalid("min_memory_bytes", "must be at least 16 MiB, got %d", r.MinMemoryBytes)
	case r.MinCPUs < 0 || r.MaxCPUs < 0 || (r.MaxCPUs > 0 && r.MinCPUs > r.MaxCPUs) || math.IsNaN(r.MinCPUs) || math.IsNaN(r.MaxCPUs):
		return errdefs.Invalid("cpus", "need 0 ≤ min ≤ max, got %v and %v", r.MinCPUs, r.MaxCPUs)
	case r.MaxCPUs > 0 && r.MinCPUs < 0.01:
		return errdefs.Invalid("min_cpus", "must be at least 0.01, got %v", r.MinCPUs)
	case r.MaxMemoryBytes == 0 && r.MaxCPUs == 0:
		return errdefs.Invalid("autoscale", "needs a memory or CPU range")
	}
	return nil
}

// Policy tunes the decisions. Zero fields take the defaults in brackets.
type Policy struct {
	GrowAt           float64       // working set / limit that grows memory [0.85]
	GrowFactor       float64       // limit multiplier per step, both ways [1.5]
	StallAt          float64       // PSI share of a tick that grows memory [0.05]
	ShrinkBelow      float64       // (working set + headroom) / limit to count as idle [0.5]
	IdleFor          time.Duration // idle time before each shrink step [60s]
	HeadroomBytes    int64         // memory kept above the working set [64 MiB] …
	HeadroomFraction float64       // … or this share of it, if more [0.25]
	CPUGrowAt        float64       // average use / quota that grows CPU [0.9]
	CPUShrinkBelow   float64       // average use / quota to count as idle [0.3]
	CPUWindow        time.Duration // averaging window of CPU use [3s]
	Backoff          time.Duration // after a refused or failed change [10s]
}

func (p *Policy) defaults() {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.GrowAt, 0.85)
	def(&p.GrowFactor, 1.5)
	def(&p.StallAt, 0.05)
	def(&p.ShrinkBelow, 0.5)
	def(&p.HeadroomFraction, 0.25)
	def(&p.CPUGrowAt, 0.9)
	def(&p.CPUShrinkBelow, 0.3)
	if p.IdleFor == 0 {
		p.IdleFor = time.Minute
	}
	if p.HeadroomBytes == 0 {
		p.HeadroomBytes = 64 << 20
	}
	if p.CPUWindow == 0 {
		p.CPUWindow = 3 * time.Second
	}
	if p.Backoff == 0 {
		p.Backoff = 10 * time.Second
	}
}

// Decision is one change of a sandbox's limits.
type Decision struct {
	Sandbox string        `json:"sandbox"`
	Time    time.Time     `json:"time"`
	From    cgroup.Limits `json:"from"`
	// To is the whole new set of limits, for cgroup.Group.Update (which
	// sets every limit it is given).
	To cgroup.Limits `json:"to"`
	// Memory and CPU say which resource moved, and which way: "grow",
	// "shrink" or "".
	Memory string `json:"memory,omitempty"`
	CPU    string `json:"cpu,omitempty"`
	Reason string `json:"reason"`
	// Error is why the change was not made, if it was not.
	Error string `json:"error,omitempty"`
}

func (d Decision) message() string {
	var parts []string
	if d.Memory != "" {
		parts = append(parts, fmt.Sprintf("memory %s → %s", mib(d.From.MemoryBytes), mib(d.To.MemoryBytes)))
	}
	if d.CPU != "" {
		parts = append(parts, fmt.Sprintf("cpus %.2f → %.2f", d.From.CPUs, d.To.CPUs))
	}
	msg := strings.Join(parts, ", ") + ": " + d.Reason
	if d.Error != "" {
		msg = "not applied: " + msg + ": " + d.Error
	}
	return msg
}

// Config configures an Autoscaler.
type Config struct {
	Policy Policy
	// Apply sets a sandbox's limits (cgroup.Group.Update). It is called on
	// the sampler's goroutine and must be quick; an Update is. Nil only
	// decides (a dry run).
	Apply func(id string, l cgroup.Limits) error
	// Admission, if set, must admit every growth (Resize) first.
	Admission *admission.Controller
	// Events, if set, gets an autoscale event per decision.
	Events *events.Log
	Logger *slog.Logger
}

// Autoscaler keeps the autoscaled sandboxes' state. It is a
// metrics.Observer, safe for concurrent use.
type Autoscaler struct {
	cfg Config
	p   Policy
	log *slog.Logger

	mu    sync.Mutex
	boxes map[string]*box

	grows, shrinks, failures atomic.Uint64
}

type box struct {
	r   Range
	lim cgroup.Limits

	seen                 bool // lastT and the counters below are set
	lastT                time.Time
	lastOOM, lastFailcnt uint64
	lastStall            float64
	cpuAvg               float64 // cores, averaged over CPUWindow
	memIdleSince         time.Time
	cpuIdleSince         time.Time
	appliedAt            time.Time
	backoffUntil         time.Time
}

var _ metrics.Observer = (*Autoscaler)(nil)

// New returns an Autoscaler.
func New(cfg Config) *Autoscaler {
	cfg.Policy.defaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Autoscaler{cfg: cfg, p: cfg.Policy, log: cfg.Logger, boxes: map[string]*box{}}
}

// Set autoscales sandbox id within r, starting from its current limits
// cur. Limits outside r are brought into it on the next sample.
func (a *Autoscaler) Set(id string, r Range, cur cgroup.Limits) error {
	if err := r.Validate(); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.boxes[id]
	if b == nil {
		b = &box{}
		a.boxes[id] = b
	}
	b.r, b.lim = r, cur
	return nil
}

// SetLimits tells the autoscaler about limits changed by someone else
// (paddock update): it carries on from them.
func (a *Autoscaler) SetLimits(id string, l cgroup.Limits) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if b := a.boxes[id]; b != nil {
		b.lim = l
		b.memIdleSince, b.cpuIdleSince = time.Time{}, time.Time{}
	}
}

// Remove stops autoscaling id.
func (a *Autoscaler) Remove(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.boxes, id)
}

// Limits returns the limits the autoscaler has id at.
func (a *Autoscaler) Limits(id string) (cgroup.Limits, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b := a.boxes[id]
	if b == nil {
		return cgroup.Limits{}, false
	}
	return b.lim, true
}

// Counts are the changes made and the ones refused or failed, for
// Prometheus.
func (a *Autoscaler) Counts() (grows, shrinks, failures uint64) {
	return a.grows.Load(), a.shrinks.Load(), a.failures.Load()
}

// Observe decides on id's new sample and applies the decision, if any.
// It implements metrics.Observer.
func (a *Autoscaler) Observe(id string, s metrics.Sample) {
	a.mu.Lock()
	b := a.boxes[id]
	if b == nil {
		a.mu.Unlock()
		return
	}
	d, ok := a.decide(b, s)
	a.mu.Unlock()
	if !ok {
		return
	}
	d.Sandbox = id
	d.Time = s.Time
	a.apply(id, b, d)
}

func (a *Autoscaler) apply(id string, b *box, d Decision) {
	grow := d.Memory == "grow" || d.CPU == "grow"
	err := error(nil)
	if a.cfg.Admission != nil {
		err = a.cfg.Admission.Resize(id, admission.Resources{CPUs: d.To.CPUs, MemoryBytes: d.To.MemoryBytes})
	}
	if err == nil && a.cfg.Apply != nil {
		if err = a.cfg.Apply(id, d.To); err != nil && a.cfg.Admission != nil {
			// Give the reservation back; shrinking is always admitted.
			_ = a.cfg.Admission.Resize(id, admission.Resources{CPUs: d.From.CPUs, MemoryBytes: d.From.MemoryBytes})
		}
	}
	a.mu.Lock()
	if a.boxes[id] == b {
		if err != nil {
			b.backoffUntil = d.Time.Add(a.p.Backoff)
			b.memIdleSince, b.cpuIdleSince = time.Time{}, time.Time{}
		} else {
			b.lim = d.To
			b.appliedAt = d.Time
		}
	}
	a.mu.Unlock()

	log := a.log.With("sandbox", id)
	switch {
	case err != nil:
		a.failures.Add(1)
		d.Error = err.Error()
		if !errors.Is(err, errdefs.ErrUnavailable) && !errors.Is(err, errdefs.ErrConflict) {
			log.Warn("autoscale: applying limits", "err", err)
		}
	case grow:
		a.grows.Add(1)
	default:
		a.shrinks.Add(1)
	}
	msg := d.message()
	log.Info("autoscale: " + msg)
	if a.cfg.Events != nil {
		if _, err := a.cfg.Events.Append(id, events.Event{Type: events.Autoscale, Time: d.Time, Message: msg, Data: events.Data(d)}); err != nil && !errors.Is(err, events.ErrRemoved) {
			log.Warn("recording autoscale event", "err", err)
		}
	}
}

// decide works out the change sample s calls for; the caller holds a.mu.
func (a *Autoscaler) decide(b *box, s metrics.Sample) (Decision, bool) {
	p := &a.p
	dt := 0.0
	if b.seen {
		dt = s.Time.Sub(b.lastT).Seconds()
	}
	if b.seen && dt <= 0 {
		return Decision{}, false // an old sample
	}
	oom := b.seen && s.OOMKills > b.lastOOM
	failcnt := b.seen && s.MemoryFailcnt > b.lastFailcnt
	stall := 0.0
	if dt > 0 {
		stall = (s.MemoryStallSeconds - b.lastStall) / dt
		alpha := 1 - math.Exp(-dt/p.CPUWindow.Seconds())
		b.cpuAvg += alpha * (s.CPUPercent/100 - b.cpuAvg)
	}
	b.seen, b.lastT = true, s.Time
	b.lastOOM, b.lastFailcnt, b.lastStall = s.OOMKills, s.MemoryFailcnt, s.MemoryStallSeconds

	// Someone else changed the memory limit (and did not say so).
	if s.MemoryLimitBytes != 0 && s.MemoryLimitBytes != b.lim.MemoryBytes && s.Time.After(b.appliedAt) && b.r.MaxMemoryBytes > 0 {
		b.lim.MemoryBytes = s.MemoryLimitBytes
	}
	if s.Time.Before(b.backoffUntil) {
		return Decision{}, false
	}

	d := Decision{From: b.lim, To: b.lim}
	var reasons []string

	if r := b.r; r.MaxMemoryBytes > 0 {
		limit := b.lim.MemoryBytes
		working := max(0, s.MemoryBytes-s.MemoryReclaimableBytes)
		need := working + max(p.HeadroomBytes, int64(p.HeadroomFraction*float64(working)))
		var why []string
		switch {
		case limit == 0:
			d.To.MemoryBytes = min(r.MaxMemoryBytes, max(r.MinMemoryBytes, roundMiB(need)))
			why = append(why, "unlimited memory brought into the range")
		case limit < r.MinMemoryBytes || limit > r.MaxMemoryBytes:
			d.To.MemoryBytes = min(max(limit, r.MinMemoryBytes), r.MaxMemoryBytes)
			why = append(why, "limit brought into the range")
		default:
			if float64(working) >= p.GrowAt*float64(limit) {
				why = append(why, fmt.Sprintf("working set %s is %.0f%% of the limit", mib(working), 100*float64(working)/float64(limit)))
			}
			if stall >= p.StallAt {
				why = append(why, fmt.Sprintf("tasks stalled on memory %.0f%% of the time", 100*stall))
			}
			if failcnt && float64(working) >= 0.5*float64(limit) {
				why = append(why, "allocations hit the limit")
			}
			if oom {
				why = append(why, "the OOM killer struck")
			}
		}
		if len(why) > 0 && d.To.MemoryBytes == b.lim.MemoryBytes && limit < r.MaxMemoryBytes {
			d.To.MemoryBytes = min(r.MaxMemoryBytes, roundMiB(max(int64(float64(limit)*p.GrowFactor), need)))
		}
		if d.To.MemoryBytes != b.lim.MemoryBytes {
			d.Memory = direction(b.lim.MemoryBytes, d.To.MemoryBytes)
			b.memIdleSince = time.Time{}
			reasons = append(reasons, why...)
		} else if len(why) == 0 && limit > r.MinMemoryBytes && float64(need) <= p.ShrinkBelow*float64(limit) {
			if b.memIdleSince.IsZero() {
				b.memIdleSince = s.Time
			} else if s.Time.Sub(b.memIdleSince) >= p.IdleFor {
				to := max(r.MinMemoryBytes, roundMiB(need), roundMiB(int64(float64(limit)/p.GrowFactor)))
				if to < limit {
					d.To.MemoryBytes, d.Memory = to, "shrink"
					reasons = append(reasons, fmt.Sprintf("working set %s under %.0f%% of the limit for %v",
						mib(working), 100*p.ShrinkBelow, s.Time.Sub(b.memIdleSince).Round(100*time.Millisecond)))
				}
				b.memIdleSince = time.Time{}
			}
		} else {
			b.memIdleSince = time.Time{}
		}
	}

	if r := b.r; r.MaxCPUs > 0 && dt > 0 {
		quota := b.lim.CPUs
		switch {
		case quota == 0 || quota < r.MinCPUs || quota > r.MaxCPUs:
			d.To.CPUs = math.Min(math.Max(quota, r.MinCPUs), r.MaxCPUs)
			if quota == 0 {
				d.To.CPUs = r.MaxCPUs
			}
			d.CPU = direction64(b.lim.CPUs, d.To.CPUs)
			reasons = append(reasons, "quota brought into the range")
		case b.cpuAvg >= p.CPUGrowAt*quota && quota < r.MaxCPUs:
			d.To.CPUs = math.Min(r.MaxCPUs, roundCPU(quota*p.GrowFactor))
			d.CPU = "grow"
			reasons = append(reasons, fmt.Sprintf("CPU use %.2f cores is %.0f%% of the quota", b.cpuAvg, 100*b.cpuAvg/quota))
			b.cpuIdleSince = time.Time{}
		case b.cpuAvg < p.CPUShrinkBelow*quota && quota > r.MinCPUs:
			if b.cpuIdleSince.IsZero() {
				b.cpuIdleSince = s.Time
			} else if s.Time.Sub(b.cpuIdleSince) >= p.IdleFor {
				to := math.Max(r.MinCPUs, math.Max(roundCPU(quota/p.GrowFactor), roundCPU(2*b.cpuAvg)))
				if to < quota {
					d.To.CPUs, d.CPU = to, "shrink"
					reasons = append(reasons, fmt.Sprintf("CPU use %.2f cores under %.0f%% of the quota for %v",
						b.cpuAvg, 100*p.CPUShrinkBelow, s.Time.Sub(b.cpuIdleSince).Round(100*time.Millisecond)))
				}
				b.cpuIdleSince = time.Time{}
			}
		default:
			b.cpuIdleSince = time.Time{}
		}
	}

	if d.Memory == "" && d.CPU == "" {
		return Decision{}, false
	}
	d.Reason = strings.Join(reasons, "; ")
	return d, true
}

// direction names a change; from unlimited is a shrink.
func direction(from, to int64) string {
	if from != 0 && to > from {
		return "grow"
	}
	return "shrink"
}

func direction64(from, to float64) string {
	if from != 0 && to > from {
		return "grow"
	}
	return "shrink"
}

func roundMiB(n int64) int64 { return (n + 1<<20 - 1) &^ (1<<20 - 1) }

// roundCPU rounds up to the kernel's quota step of 0.01 core.
func roundCPU(c float64) float64 { return math.Ceil(c*100-1e-9) / 100 }

func mib(n int64) string { return fmt.Sprintf("%d MiB", n>>20) }
