package sandbox

import (
	"context"
	"fmt"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Observer hears what happens to sandboxes: telemetry (metrics, events,
// budgets, autoscale) and host admission implement it. Calls are made
// with the sandbox's lock held, so they must be quick and must not call
// back into the Manager (start a goroutine for that).
type Observer interface {
	// Admit reserves host capacity for a sandbox about to start; key is
	// its id, or a provisional key when the runtime picks the id. A
	// refusal (ErrUnavailable, saying why) fails the create or resume.
	Admit(key string, res api.Resources) error
	// Release returns an admission that did not become a running sandbox,
	// or that of a sandbox whose processes were killed for its removal
	// (Removed follows once its teardown is done).
	Release(key string)
	// Running: the sandbox's processes run (created, resumed, or found
	// running after a daemon restart, when Admit was not called). key is
	// what Admit was given.
	Running(key string, s api.Sandbox)
	// Stopped: its processes are gone (stopped, paused or failed).
	Stopped(s api.Sandbox)
	// Removed: the sandbox and its records are gone.
	Removed(id string)
	// Resize asks to change a running sandbox's limits; a refusal keeps
	// the old ones.
	Resize(id string, res api.Resources) error
	// Changed: limits, budget or autoscale settings changed.
	Changed(s api.Sandbox)
	// Event records something that happened to a sandbox (a snapshot, a
	// freeze, a fork).
	Event(id, kind, message string, data any)
}

// nopObserver is the Observer of a Manager configured without one.
type nopObserver struct{}

func (nopObserver) Admit(string, api.Resources) error  { return nil }
func (nopObserver) Release(string)                     {}
func (nopObserver) Running(string, api.Sandbox)        {}
func (nopObserver) Stopped(api.Sandbox)                {}
func (nopObserver) Removed(string)                     {}
func (nopObserver) Resize(string, api.Resources) error { return nil }
func (nopObserver) Changed(api.Sandbox)                {}
func (nopObserver) Event(string, string, string, any)  {}

// SetObserver sets the Observer; call it before Reconcile.
func (m *Manager) SetObserver(o Observer) { m.obs = o }

// Update changes a running sandbox's limits (and its budget or autoscale
// bounds) in place, without restarting anything.
func (m *Manager) Update(ctx context.Context, id string, req api.UpdateRequest) (api.Sandbox, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	res := b.rec.Resources
	n := req.Resources
	if n.DiskBytes != 0 && n.DiskBytes != res.DiskBytes {
		return api.Sandbox{}, errdefs.Invalid("resources.disk_bytes", "the disk of a sandbox cannot be resized")
	}
	if n.CPUs != 0 {
		res.CPUs = n.CPUs
	}
	if n.MemoryBytes != 0 {
		res.MemoryBytes = n.MemoryBytes
	}
	if n.Pids != 0 {
		res.Pids = n.Pids
	}
	if err := validateLimits(res, req.Budget, req.Autoscale, hostCPUs()); err != nil {
		return api.Sandbox{}, err
	}
	if res != b.rec.Resources {
		mv, err := next(b, actUpdate)
		if err != nil {
			return api.Sandbox{}, err
		}
		if mv.step == stepLive {
			if err := m.notify(b).Resize(id, res); err != nil {
				return api.Sandbox{}, err
			}
			if err := b.inst.Update(res); err != nil {
				m.notify(b).Resize(id, b.rec.Resources)
				return api.Sandbox{}, fmt.Errorf("updating limits of %s: %w", id, err)
			}
		}
		b.rec.Resources = res
	}
	if req.Budget != nil {
		b.rec.Budget = req.Budget
	}
	if req.Autoscale != nil {
		b.rec.Autoscale = req.Autoscale
	}
	m.persistLocked(b)
	view := b.viewLocked()
	m.notify(b).Changed(view)
	m.log.Info("sandbox updated", "sandbox", id, "cpus", res.CPUs, "memory", res.MemoryBytes, "pids", res.Pids)
	return view, nil
}

// DiskUsage reports the bytes used on a sandbox's disk and its size.
func (m *Manager) DiskUsage(ctx context.Context, id string) (used, size int64, err error) {
	return m.cfg.Runtime.DiskUsage(id)
}
