// Package budget owns per-sandbox usage budgets: CPU seconds, wall time,
// egress bytes, egress requests and a cost from configurable prices. On
// every sampler tick it adds up what each sandbox used, warns once at a
// threshold, and when a budget is reached says which action to take
// (pause, kill, cut the network). The daemon carries out the action; this
// package only decides, calls back and writes the event.
package budget

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
)

// Kind names a budget.
type Kind string

const (
	CPUSeconds  Kind = "cpu_seconds"
	WallSeconds Kind = "wall_seconds"
	// EgressBytes counts bytes through the egress proxy, both ways.
	EgressBytes Kind = "egress_bytes"
	// EgressRequests counts requests through the egress proxy, allowed
	// and denied.
	EgressRequests Kind = "egress_requests"
	Cost           Kind = "cost"
)

// Kinds lists every budget, in the order they are evaluated.
var Kinds = [...]Kind{CPUSeconds, WallSeconds, EgressBytes, EgressRequests, Cost}

// Action is what the daemon does when a budget is reached.
type Action string

const (
	// None only records the event.
	None       Action = "none"
	Pause      Action = "pause"
	Kill       Action = "kill"
	CutNetwork Action = "cut_network"
)

func (a Action) valid() bool {
	switch a {
	case None, Pause, Kill, CutNetwork:
		return true
	}
	return false
}

// Spec is a sandbox's budgets. A zero limit means none.
type Spec struct {
	CPUSeconds     float64 `json:"cpu_seconds,omitempty"`
	WallSeconds    float64 `json:"wall_seconds,omitempty"`
	EgressBytes    float64 `json:"egress_bytes,omitempty"`
	EgressRequests float64 `json:"egress_requests,omitempty"`
	// Cost is in the currency of Prices.
	Cost float64 `json:"cost,omitempty"`
	// WarnAt is the fraction of a budget at which a warning fires, once.
	// Default 0.8.
	WarnAt float64 `json:"warn_at,omitempty"`
	// Action runs when a budget is reached. Default pause.
	Action Action `json:"action,omitempty"`
	// Actions overrides Action per budget (cut_network for egress_bytes,
	// say).
	Actions map[Kind]Action `json:"actions,omitempty"`
}

func (s *Spec) limit(k Kind) float64 {
	switch k {
	case CPUSeconds:
		return s.CPUSeconds
	case WallSeconds:
		return s.WallSeconds
	case EgressBytes:
		return s.EgressBytes
	case EgressRequests:
		return s.EgressRequests
	case Cost:
		return s.Cost
	}
	return 0
}

func (s *Spec) action(k Kind) Action {
	if a, ok := s.Actions[k]; ok {
		return a
	}
	return s.Action
}

// Validate checks s and fills its defaults.
func (s *Spec) Validate() error {
	for _, k := range Kinds {
		if l := s.limit(k); l < 0 || math.IsNaN(l) || math.IsInf(l, 0) {
			return errdefs.Invalid(string(k), "must be a non-negative number, got %v", l)
		}
	}
	if s.WarnAt == 0 {
		s.WarnAt = 0.8
	}
	if !(s.WarnAt > 0 && s.WarnAt <= 1) {
		return errdefs.Invalid("warn_at", "must be in (0, 1], got %v", s.WarnAt)
	}
	if s.Action == "" {
		s.Action = Pause
	}
	if !s.Action.valid() {
		return errdefs.Invalid("action", "must be none, pause, kill or cut_network, got %q", s.Action)
	}
	for k, a := range s.Actions {
		if !known(k) {
			return errdefs.Invalid("actions", "unknown budget %q", k)
		}
		if !a.valid() {
			return errdefs.Invalid("actions", "%s: must be none, pause, kill or cut_network, got %q", k, a)
		}
	}
	return nil
}

func known(k Kind) bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// Prices turn usage into a cost. Zero prices cost nothing.
type Prices struct {
	CPUSecond    float64 `json:"cpu_second"`
	MemoryGBHour float64 `json:"memory_gb_hour"` // of the memory limit (usage where unlimited); 1 GB = 1e9 bytes
	EgressGB     float64 `json:"egress_gb"`      // both ways; 1 GB = 1e9 bytes
}

// Usage is what a sandbox has used against its budgets. The daemon keeps
// it with the sandbox's record (Tracker.Usage) and hands it back to Set
// after a restart, so that budgets and the once-only warnings survive.
type Usage struct {
	CPUSeconds     float64 `json:"cpu_seconds"`
	EgressBytes    float64 `json:"egress_bytes"`
	EgressRequests float64 `json:"egress_requests"`
	MemoryGBHours  float64 `json:"memory_gb_hours"`
	Warned         []Kind  `json:"warned,omitempty"`
	Exceeded       []Kind  `json:"exceeded,omitempty"`

	// The last sample's counters, to count what was used while the
	// daemon was down (the cgroup's CPU counter keeps going).
	Last *Counters `json:"last,omitempty"`
}

// Counters are the cumulative values of a sample that usage grows from.
type Counters struct {
	Time        time.Time `json:"time"`
	CPUSeconds  float64   `json:"cpu_seconds"`
	NetBytes    uint64    `json:"net_bytes"`
	Requests    uint64    `json:"requests"`
	MemoryBytes int64     `json:"memory_bytes"`
}

// Notice is a warning or an exceeded budget, as the callbacks and the
// events see it.
type Notice struct {
	Budget   Kind    `json:"budget"`
	Used     float64 `json:"used"`
	Limit    float64 `json:"limit"`
	Exceeded bool    `json:"exceeded"`
	// Action is the action to run, for an exceeded budget.
	Action Action `json:"action,omitempty"`
}

// Config configures a Tracker.
type Config struct {
	Prices Prices
	// OnWarn and OnExceeded are called on the sampler's goroutine, once
	// per budget crossing: they must not block (run the action in a
	// goroutine). Either may be nil.
	OnWarn     func(id string, n Notice)
	OnExceeded func(id string, n Notice)
	// Events, if set, gets a budget event for each notice.
	Events *events.Log
	Logger *slog.Logger
	// Now is the clock for wall time; default time.Now.
	Now func() time.Time
}

// Tracker keeps every budgeted sandbox's usage. It is a metrics.Observer.
type Tracker struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	boxes map[string]*box
	// warnings and exceeded count notices by budget, in Kinds order.
	warnings, exceeded [len(Kinds)]uint64
}

type box struct {
	spec     Spec
	start    time.Time
	u        Usage
	warned   map[Kind]bool
	exceeded map[Kind]bool
}

var _ metrics.Observer = (*Tracker)(nil)

// New returns a Tracker.
func New(cfg Config) *Tracker {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Tracker{cfg: cfg, log: cfg.Logger, boxes: map[string]*box{}}
}

// Set gives sandbox id budgets spec, counting wall time from start, and
// the usage it had (zero for a new sandbox). Setting a sandbox again (new
// limits) keeps its current usage unless u is given, and re-arms the
// warnings and actions of the budgets it is now under.
func (t *Tracker) Set(id string, spec Spec, start time.Time, u *Usage) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.boxes[id]
	if b == nil || u != nil {
		b = &box{warned: map[Kind]bool{}, exceeded: map[Kind]bool{}}
		if u != nil {
			b.u = *u
			for _, k := range u.Warned {
				b.warned[k] = true
			}
			for _, k := range u.Exceeded {
				b.exceeded[k] = true
			}
		}
		t.boxes[id] = b
	}
	b.spec, b.start = spec, start
	for _, k := range Kinds {
		used, limit := t.used(b, k, t.cfg.Now()), spec.limit(k)
		if limit == 0 || used < limit {
			delete(b.exceeded, k)
		}
		if limit == 0 || used < spec.WarnAt*limit {
			delete(b.warned, k)
		}
	}
	return nil
}

// Remove forgets id.
func (t *Tracker) Remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.boxes, id)
}

// Usage returns id's usage, for the daemon to persist.
func (t *Tracker) Usage(id string) (Usage, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.boxes[id]
	if b == nil {
		return Usage{}, errdefs.NotFound("budget of sandbox", id)
	}
	return b.usage(), nil
}

func (b *box) usage() Usage {
	u := b.u
	if u.Last != nil {
		last := *u.Last
		u.Last = &last
	}
	u.Warned, u.Exceeded = keys(b.warned), keys(b.exceeded)
	return u
}

func keys(m map[Kind]bool) []Kind {
	var ks []Kind
	for k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i] < ks[j] })
	return ks
}

// Line is one budget's state in a Status.
type Line struct {
	Budget    Kind    `json:"budget"`
	Used      float64 `json:"used"`
	Limit     float64 `json:"limit"`
	Remaining float64 `json:"remaining"`
	Warned    bool    `json:"warned"`
	Exceeded  bool    `json:"exceeded"`
	Action    Action  `json:"action"`
}

// Status is a sandbox's budgets as the API and the agent inside see them.
type Status struct {
	Spec    Spec   `json:"spec"`
	Budgets []Line `json:"budgets"` // only those with a limit
	Usage   Usage  `json:"usage"`
}

// Status returns id's budgets, usage and what remains.
func (t *Tracker) Status(id string) (Status, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.boxes[id]
	if b == nil {
		return Status{}, errdefs.NotFound("budget of sandbox", id)
	}
	st := Status{Spec: b.spec, Usage: b.usage()}
	now := t.cfg.Now()
	for _, k := range Kinds {
		limit := b.spec.limit(k)
		if limit == 0 {
			continue
		}
		used := t.used(b, k, now)
		st.Budgets = append(st.Budgets, Line{
			Budget: k, Used: used, Limit: limit, Remaining: max(0, limit-used),
			Warned: b.warned[k], Exceeded: b.exceeded[k], Action: b.spec.action(k),
		})
	}
	return st, nil
}

// used is how much of budget k sandbox b has used by now.
func (t *Tracker) used(b *box, k Kind, now time.Time) float64 {
	switch k {
	case CPUSeconds:
		return b.u.CPUSeconds
	case WallSeconds:
		if b.start.IsZero() {
			return 0
		}
		return max(0, now.Sub(b.start).Seconds())
	case EgressBytes:
		return b.u.EgressBytes
	case EgressRequests:
		return b.u.EgressRequests
	case Cost:
		p := t.cfg.Prices
		return b.u.CPUSeconds*p.CPUSecond + b.u.MemoryGBHours*p.MemoryGBHour + b.u.EgressBytes/1e9*p.EgressGB
	}
	return 0
}

// Observe adds what sandbox id used since its last sample and fires the
// warnings and actions it now crosses. It implements metrics.Observer.
func (t *Tracker) Observe(id string, s metrics.Sample) {
	t.mu.Lock()
	b := t.boxes[id]
	if b == nil {
		t.mu.Unlock()
		return
	}
	cur := Counters{
		Time:        s.Time,
		CPUSeconds:  s.CPUSeconds,
		NetBytes:    s.NetRxBytes + s.NetTxBytes,
		Requests:    s.EgressAllowed + s.EgressDenied,
		MemoryBytes: s.MemoryLimitBytes,
	}
	if cur.MemoryBytes == 0 {
		cur.MemoryBytes = s.MemoryBytes
	}
	if last := b.u.Last; last != nil {
		b.u.CPUSeconds += grown(last.CPUSeconds, cur.CPUSeconds)
		b.u.EgressBytes += float64(grownU(last.NetBytes, cur.NetBytes))
		b.u.EgressRequests += float64(grownU(last.Requests, cur.Requests))
		if dt := cur.Time.Sub(last.Time).Hours(); dt > 0 {
			b.u.MemoryGBHours += float64(last.MemoryBytes) / 1e9 * dt
		}
	} else {
		// The first sample of a sandbox: what its counters hold was used
		// under this budget (they start with the sandbox).
		b.u.CPUSeconds += cur.CPUSeconds
		b.u.EgressBytes += float64(cur.NetBytes)
		b.u.EgressRequests += float64(cur.Requests)
	}
	b.u.Last = &cur

	var notices []Notice
	for _, k := range Kinds {
		limit := b.spec.limit(k)
		if limit == 0 {
			continue
		}
		used := t.used(b, k, s.Time)
		// A hair of slack, so that sums of float prices reach round limits.
		reach := used + limit*1e-9
		switch {
		case reach >= limit && !b.exceeded[k]:
			b.exceeded[k], b.warned[k] = true, true
			notices = append(notices, Notice{Budget: k, Used: used, Limit: limit, Exceeded: true, Action: b.spec.action(k)})
		case reach >= b.spec.WarnAt*limit && !b.warned[k]:
			b.warned[k] = true
			notices = append(notices, Notice{Budget: k, Used: used, Limit: limit})
		}
	}
	for _, n := range notices {
		for i, k := range Kinds {
			if k == n.Budget && n.Exceeded {
				t.exceeded[i]++
			} else if k == n.Budget {
				t.warnings[i]++
			}
		}
	}
	t.mu.Unlock()

	for _, n := range notices {
		t.notify(id, n)
	}
}

// Counts are the warnings and exceeded budgets so far, by budget, for
// Prometheus.
func (t *Tracker) Counts() (warnings, exceeded map[Kind]uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	warnings, exceeded = map[Kind]uint64{}, map[Kind]uint64{}
	for i, k := range Kinds {
		warnings[k], exceeded[k] = t.warnings[i], t.exceeded[i]
	}
	return warnings, exceeded
}

func (t *Tracker) notify(id string, n Notice) {
	msg := fmt.Sprintf("budget %s at %.0f%%: %s of %s", n.Budget, 100*n.Used/n.Limit, format(n.Budget, n.Used), format(n.Budget, n.Limit))
	if n.Exceeded {
		msg = fmt.Sprintf("budget %s reached: %s of %s; action: %s", n.Budget, format(n.Budget, n.Used), format(n.Budget, n.Limit), n.Action)
	}
	t.log.Info(msg, "sandbox", id)
	if t.cfg.Events != nil {
		if _, err := t.cfg.Events.Append(id, events.Event{Type: events.Budget, Message: msg, Data: events.Data(n)}); err != nil && !errors.Is(err, events.ErrRemoved) {
			t.log.Warn("recording budget event", "sandbox", id, "err", err)
		}
	}
	if n.Exceeded {
		if t.cfg.OnExceeded != nil {
			t.cfg.OnExceeded(id, n)
		}
	} else if t.cfg.OnWarn != nil {
		t.cfg.OnWarn(id, n)
	}
}

func format(k Kind, v float64) string {
	switch k {
	case CPUSeconds, WallSeconds:
		return fmt.Sprintf("%.1fs", v)
	case EgressBytes:
		return fmt.Sprintf("%.1f MB", v/1e6)
	case Cost:
		return fmt.Sprintf("%.4f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// grown is what a cumulative counter grew by; one that went down was
// reset (a new cgroup, a restarted proxy) and counts from zero.
func grown(prev, cur float64) float64 {
	if cur >= prev {
		return cur - prev
	}
	return cur
}

func grownU(prev, cur uint64) uint64 {
	if cur >= prev {
		return cur - prev
	}
	return cur
}
