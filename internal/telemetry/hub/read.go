package hub

import (
	"context"
	"encoding/json"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/telemetry/budget"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/execlog"
)

func toBudgets(st budget.Status) *api.BudgetStatus {
	out := &api.BudgetStatus{Budgets: make([]api.BudgetLine, 0, len(st.Budgets))}
	for _, l := range st.Budgets {
		out.Budgets = append(out.Budgets, api.BudgetLine{Budget: string(l.Budget), Used: l.Used, Limit: l.Limit,
			Remaining: l.Remaining, Warned: l.Warned, Exceeded: l.Exceeded, Action: string(l.Action)})
	}
	out.Usage, _ = json.Marshal(st.Usage)
	return out
}

// Metrics returns sandbox id's current sample, its history between from
// and to, and its budgets and autoscaled limits while it runs.
func (h *Hub) Metrics(id string, from, to time.Time) (api.Metrics, error) {
	out := api.Metrics{Sandbox: id, IntervalSeconds: h.cfg.Interval.Seconds(), History: []api.Sample{}}
	cur, ok, err := h.sampler.Current(id)
	if err != nil {
		return out, err
	}
	if ok {
		s := cur.Sample
		out.Current = &s
	}
	hist, err := h.sampler.History(id, from, to)
	if err != nil {
		return out, err
	}
	for _, s := range hist {
		out.History = append(out.History, s.Sample)
	}
	if st, err := h.budgets.Status(id); err == nil {
		out.Budgets = toBudgets(st)
	}
	if l, ok := h.scaler.Limits(id); ok {
		out.Autoscale = &api.Resources{CPUs: l.CPUs, MemoryBytes: l.MemoryBytes, Pids: l.Pids}
	}
	if h.cfg.Storage != nil {
		if sp, err := h.cfg.Storage(); err == nil {
			out.Storage = &sp
		}
	}
	return out, nil
}

// ContainerMetrics is Metrics for container name of a sandbox of several:
// its share and its history (budgets and autoscaling are the sandbox's).
func (h *Hub) ContainerMetrics(id, name string, from, to time.Time) (api.Metrics, error) {
	out := api.Metrics{Sandbox: id, Container: name, IntervalSeconds: h.cfg.Interval.Seconds(), History: []api.Sample{}}
	cur, ok, hist, err := h.sampler.ContainerHistory(id, name, from, to)
	if err != nil {
		return out, err
	}
	if ok {
		out.Current = &cur.Sample
	}
	for _, s := range hist {
		out.History = append(out.History, s.Sample)
	}
	return out, nil
}

// Latest returns the latest sample of every sandbox being sampled.
func (h *Hub) Latest() []api.SandboxSample {
	latest := h.sampler.Running(nil)
	out := make([]api.SandboxSample, 0, len(latest))
	for _, l := range latest {
		out = append(out, api.SandboxSample{ID: l.ID, Sample: l.Sample.Sample})
	}
	return out
}

// EventQuery selects events.
type EventQuery struct {
	After uint64
	Since time.Time
	Types []string
	Limit int
}

// Events returns sandbox id's retained events matching q, oldest first.
func (h *Hub) Events(id string, q EventQuery) ([]api.Event, error) {
	return h.events.List(id, events.Query{After: q.After, Since: q.Since, Limit: q.Limit, Types: q.Types})
}

// FollowEvents streams sandbox id's events after seq after, then each
// new one, until ctx ends.
func (h *Hub) FollowEvents(ctx context.Context, id string, after uint64) (<-chan api.Event, error) {
	return h.events.Follow(ctx, id, after)
}

// Logs lists sandbox id's processes with kept output, oldest first.
func (h *Hub) Logs(id string) ([]api.ExecLog, error) {
	ps, err := h.execs.List(id)
	if err != nil {
		return nil, err
	}
	out := make([]api.ExecLog, 0, len(ps))
	for _, p := range ps {
		out = append(out, api.ExecLog(p))
	}
	return out, nil
}

// Log finds the newest process of sandbox id with pid.
func (h *Hub) Log(id, ctr string, pid int) (api.ExecLog, error) {
	p, err := h.execs.Find(id, ctr, pid)
	if err != nil {
		return api.ExecLog{}, err
	}
	return api.ExecLog(p), nil
}

// ReadLog calls fn with process seq's kept output from offset from on;
// with follow it waits for more until the process ends or ctx does.
func (h *Hub) ReadLog(ctx context.Context, id string, seq uint64, from int64, follow bool, fn func(execlog.Chunk) error) error {
	return h.execs.Read(ctx, id, seq, from, follow, fn)
}

// Self is what sandbox id may know of itself, for /run/paddock and
// http://paddock.internal/v1/self: its limits (as in force now, autoscale
// included), its usage, and its budgets with what remains. The gateway
// adds its policy and denials.
func (h *Hub) Self(id string) (api.Self, error) {
	h.mu.Lock()
	st := h.boxes[id]
	var lim api.Resources
	var auto *api.Autoscale
	if st != nil {
		lim = api.Resources{CPUs: st.res.CPUs, MemoryBytes: st.res.MemoryBytes, Pids: st.res.Pids, DiskBytes: st.res.DiskBytes}
		auto = st.autoscale
	}
	h.mu.Unlock()
	if st == nil {
		return api.Self{}, errdefs.NotFound("sandbox", id)
	}
	if l, ok := h.scaler.Limits(id); ok {
		lim.CPUs, lim.MemoryBytes = l.CPUs, l.MemoryBytes
	}
	v := api.Self{Sandbox: id, Limits: &lim, Autoscale: auto}
	if cur, ok, err := h.sampler.Current(id); err == nil && ok {
		v.Usage = &cur.Sample
	}
	if bs, err := h.budgets.Status(id); err == nil {
		v.Budgets = toBudgets(bs).Budgets
	}
	return v, nil
}
