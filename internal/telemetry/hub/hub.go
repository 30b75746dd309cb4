// Package hub owns the wiring of paddock's telemetry: one Hub hears the
// sandbox manager's lifecycle (it is a sandbox.Observer) and keeps the
// sampler, the event log, the exec output log, budgets, the autoscaler,
// host admission and the Prometheus collector in step with it. The
// daemon makes one Hub; the server reads from it.
package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/fdnotify"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/sandbox"
	"github.com/paddock-dev/paddock/internal/shrink"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/autoscale"
	"github.com/paddock-dev/paddock/internal/telemetry/budget"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/execlog"
	"github.com/paddock-dev/paddock/internal/telemetry/metrics"
	"github.com/paddock-dev/paddock/internal/telemetry/prom"
)

// Config configures a Hub.
type Config struct {
	// Dir holds the event logs, exec output and budget usage.
	Dir string
	// Cgroups finds each running sandbox's cgroup to sample and resize.
	Cgroups *cgroup.Manager
	// Disk reports a sandbox's disk use and size; nil leaves them zero.
	Disk func(id string) (used, size int64, err error)
	// Storage reports the space left for disks; nil reports none.
	Storage func() (api.StorageSpace, error)
	// Interval between samples; default 1 s.
	Interval time.Duration
	// Prices turn usage into a cost for the cost budget.
	Prices budget.Prices
	// Capacity is what the host offers sandboxes; zero reads the host.
	Capacity admission.Resources
	// Reserved is kept back for the host (default 512 MiB of memory).
	Reserved admission.Resources
	// CPUOvercommit (default 4) and MemoryOvercommit (default 1) multiply
	// the capacity left after Reserved.
	CPUOvercommit, MemoryOvercommit float64
	// Autoscale tunes the autoscaler (zero fields take its defaults).
	Autoscale autoscale.Policy
	// States and WarmPools feed the Prometheus collector; either may be nil.
	States      func() map[string]int
	WarmPools   func() map[string]int
	WarmTargets func() map[string]int
	Logger      *slog.Logger
}

// Actions carry out what a reached budget asks for. The daemon sets them
// once the manager and the gateway exist; each runs on a goroutine of its
// own.
type Actions struct {
	Pause      func(ctx context.Context, id string) error
	Kill       func(ctx context.Context, id string) error
	CutNetwork func(ctx context.Context, id string) error
}

// Hub is the daemon's telemetry. It implements sandbox.Observer.
type Hub struct {
	cfg Config
	log *slog.Logger
	// usageMu orders a save of a sandbox's budget usage and its
	// removal: a save that read the usage before the removal would
	// otherwise write the file after it, a file no sandbox owns.
	usageMu  sync.Mutex
	events   *events.Log
	execs    *execlog.Store
	adm      *admission.Controller
	budgets  *budget.Tracker
	scaler   *autoscale.Autoscaler
	oom      *events.OOMWatch
	nets     *metrics.NetTable
	sampler  *metrics.Sampler
	col      *prom.Collector
	registry *prometheus.Registry
	// room is the host's capacity less what is kept back: no one sandbox
	// may have a memory limit above it, whatever the overcommit.
	room admission.Resources

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// notify tells the exec copies of quiet processes when their stream
	// has input (nil: each waits on a goroutine of its own).
	notify *fdnotify.Notifier

	mu       sync.Mutex
	actions  Actions
	guests   func(ctx context.Context, id, ctr string) (*guestapi.Client, error)
	admitted map[string]time.Time // keys given to Admit, when
	boxes    map[string]*state
	// admittedPeak and boxesPeak are for shrink.Map.
	admittedPeak, boxesPeak int
}

// state is what the hub keeps of a sandbox it has seen run.
type state struct {
	res       api.Resources
	budget    *api.Budget
	autoscale *api.Autoscale
	group     *cgroup.Group // nil while it does not run
}

var _ sandbox.Observer = (*Hub)(nil)

// New opens the logs and makes the parts; call Run to start sampling.
func New(cfg Config) (*Hub, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.Reserved == (admission.Resources{}) {
		cfg.Reserved.MemoryBytes = 512 << 20
	}
	if cfg.CPUOvercommit == 0 {
		cfg.CPUOvercommit = 4
	}
	if cfg.MemoryOvercommit == 0 {
		cfg.MemoryOvercommit = 1
	}
	log := cfg.Logger
	h := &Hub{cfg: cfg, log: log, admitted: map[string]time.Time{}, boxes: map[string]*state{}, nets: new(metrics.NetTable)}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	var err error
	if h.events, err = events.Open(events.Config{Dir: filepath.Join(cfg.Dir, "events"), MaxBytes: 1 << 20, Logger: log}); err != nil {
		return nil, err
	}
	if h.execs, err = execlog.Open(execlog.Config{Dir: filepath.Join(cfg.Dir, "execlog"), Logger: log}); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(h.usageDir(), 0o700); err != nil {
		return nil, fmt.Errorf("creating the budget usage directory: %w", err)
	}
	capy := cfg.Capacity
	if capy == (admission.Resources{}) {
		if capy, err = admission.HostCapacity(); err != nil {
			return nil, err
		}
	}
	h.room = admission.Resources{CPUs: capy.CPUs - cfg.Reserved.CPUs, MemoryBytes: capy.MemoryBytes - cfg.Reserved.MemoryBytes}
	if h.adm, err = admission.New(admission.Config{Capacity: capy, Reserved: cfg.Reserved,
		CPUOvercommit: cfg.CPUOvercommit, MemoryOvercommit: cfg.MemoryOvercommit}); err != nil {
		return nil, err
	}
	h.budgets = budget.New(budget.Config{Prices: cfg.Prices, Events: h.events, Logger: log,
		OnExceeded: func(id string, n budget.Notice) { h.budgetAction(id, n) }})
	h.scaler = autoscale.New(autoscale.Config{Policy: cfg.Autoscale, Admission: h.adm, Events: h.events, Logger: log,
		Apply: h.applyLimits})
	h.oom = events.NewOOMWatch(h.events)
	if h.sampler, err = metrics.NewSampler(metrics.Config{Interval: cfg.Interval,
		Observers: []metrics.Observer{h.oom, h.budgets, h.scaler}, Logger: log}); err != nil {
		return nil, err
	}
	if h.col, err = prom.New(prom.Config{Sampler: h.sampler, States: cfg.States, WarmPools: cfg.WarmPools, WarmTargets: cfg.WarmTargets,
		Admission: h.adm, Budgets: h.budgets, Autoscaler: h.scaler, Storage: cfg.Storage}); err != nil {
		return nil, err
	}
	if h.notify, err = fdnotify.New(); err != nil {
		log.Warn("exec output copies will wait on a goroutine each", "err", err)
	}
	h.registry = prometheus.NewRegistry()
	h.registry.MustRegister(h.col, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return h, nil
}

// SetActions sets what reached budgets do.
func (h *Hub) SetActions(a Actions) {
	h.mu.Lock()
	h.actions = a
	h.mu.Unlock()
}

// Run samples until Close.
func (h *Hub) Run() {
	h.wg.Add(2)
	go func() {
		defer h.wg.Done()
		h.sampler.Run(h.ctx)
	}()
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-h.ctx.Done():
				return
			case <-t.C:
				h.saveUsages()
			}
		}
	}()
}

// Close stops sampling and the exec copies, and saves budget usage. The
// copies carry on where they stopped under the next daemon.
func (h *Hub) Close() {
	h.cancel()
	h.wg.Wait()
	if h.notify != nil {
		h.notify.Close()
	}
	h.saveUsages()
	h.sampler.Close()
}

// Registry is the Prometheus registry of the daemon and its sandboxes.
func (h *Hub) Registry() *prometheus.Registry { return h.registry }

// Admission is admission control's state: the most that can be
// reserved, and what is (a cluster node publishes both).
func (h *Hub) Admission() (limits, inUse admission.Resources) {
	return h.adm.Limits(), h.adm.InUse()
}

// Sampler is the metrics sampler (for benchmarks).
func (h *Hub) Sampler() *metrics.Sampler { return h.sampler }

// Admit implements sandbox.Observer.
func (h *Hub) Admit(key string, res api.Resources) error {
	if err := h.fitsHost(res); err != nil {
		h.col.CreateFailed()
		return err
	}
	if err := h.adm.Reserve(key, admission.Resources{CPUs: res.CPUs, MemoryBytes: res.MemoryBytes}); err != nil {
		h.col.CreateFailed()
		return err
	}
	h.mu.Lock()
	h.admitted[key] = time.Now()
	h.mu.Unlock()
	return nil
}

// fitsHost refuses a memory limit larger than the host can ever give one
// sandbox: overcommit shares the host among sandboxes, it does not make
// the host bigger.
func (h *Hub) fitsHost(res api.Resources) error {
	if res.MemoryBytes > h.room.MemoryBytes {
		return errdefs.New(errdefs.ErrUnavailable, "memory: %.1f GiB requested, more than the %.1f GiB this host has for sandboxes",
			float64(res.MemoryBytes)/(1<<30), float64(h.room.MemoryBytes)/(1<<30))
	}
	return nil
}

// Release implements sandbox.Observer.
func (h *Hub) Release(key string) {
	h.adm.Release(key)
	h.mu.Lock()
	delete(h.admitted, key)
	h.admitted = shrink.Map(h.admitted, &h.admittedPeak)
	h.mu.Unlock()
}

// Running implements sandbox.Observer: sample the sandbox, and hold its
// budgets and autoscale range.
func (h *Hub) Running(key string, s api.Sandbox) {
	id := s.ID
	h.mu.Lock()
	t0, fresh := h.admitted[key]
	delete(h.admitted, key)
	h.admitted = shrink.Map(h.admitted, &h.admittedPeak)
	st := h.boxes[id]
	if st == nil {
		st = &state{}
		h.boxes[id] = st
	}
	st.res, st.budget, st.autoscale = s.Resources, s.Budget, s.Autoscale
	h.mu.Unlock()
	lim := admission.Resources{CPUs: s.Resources.CPUs, MemoryBytes: s.Resources.MemoryBytes}
	if fresh {
		if key != id {
			h.adm.Rename(key, id)
		}
	} else {
		// Found running after a daemon restart: it holds what it has.
		h.adm.Restore(id, lim)
	}
	// Watched for oom kills before the sampler can report it.
	if fresh {
		h.oom.Started(id)
	} else {
		h.oom.Resumed(id)
	}
	log := h.log.With("sandbox", id)
	g, err := h.cfg.Cgroups.Load(id)
	if err != nil {
		log.Warn("sandbox has no cgroup to sample", "err", err)
	} else {
		h.mu.Lock()
		st.group = g
		h.mu.Unlock()
		h.sampler.Register(id, h.source(id, g, s.Containers))
	}
	if !fresh && s.State == api.StateRunning {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.resumeCopies(id)
		}()
	}
	if fresh {
		if s.State == api.StateRunning && t0 != (time.Time{}) && s.CreatedAt.After(t0.Add(-time.Second)) {
			h.col.Created(time.Since(t0))
		}
	}
	h.setBudget(id, s, true)
	h.setAutoscale(id, s)
}

// source reads a sandbox's cgroup through kept-open control files (or
// cgroup.Stats where they cannot be found), its disk and its network
// counters; for a sandbox of several containers, each running
// container's cgroup and every container's disk too.
func (h *Hub) source(id string, g *cgroup.Group, cs []api.ContainerStatus) *metrics.CgroupSource {
	src := &metrics.CgroupSource{Cgroup: &lazyCgroup{open: func() metrics.CgroupReader { return h.cgroupReader(g) }}, Net: h.nets.Get(id)}
	if h.cfg.Disk != nil {
		src.Disk = &diskCache{id: id, read: h.cfg.Disk}
	}
	if len(cs) < 2 {
		return src
	}
	src.Containers = make([]metrics.ContainerPart, len(cs))
	for i, c := range cs {
		p := &src.Containers[i]
		p.Name = c.Name
		if i == 0 {
			continue
		}
		if h.cfg.Disk != nil {
			p.Disk = &diskCache{id: runtime.ContainerID(id, c.Name), read: h.cfg.Disk}
		}
		if c.State != api.StateRunning && c.State != api.StateFailed {
			continue
		}
		// The native runtime's cgroup of a container: ID/NAME, inside
		// its sandbox's.
		if cg, err := h.cfg.Cgroups.Load(id + "/" + c.Name); err == nil {
			p.Cgroup = h.cgroupReader(cg)
		}
	}
	return src
}

// cgroupReader reads g through kept-open control files, or cgroup.Stats
// where they cannot be found.
func (h *Hub) cgroupReader(g *cgroup.Group) metrics.CgroupReader {
	if files, err := metrics.OpenCgroupFiles(metrics.GroupDirs(h.cfg.Cgroups.Mode(), g)); err == nil {
		return files
	}
	return metrics.GroupStats{Group: g}
}

// lazyCgroup opens a sandbox's cgroup reader (its control files, 11 on
// v1) at its first read rather than when the sandbox starts: under churn
// most sandboxes are gone before the sampler's first tick, and opening
// and closing the files cost each of them some 50 system calls for
// nothing (issue 21). The sampler never reads a source and closes it at
// once; the lock keeps a read after Close from opening the files again.
type lazyCgroup struct {
	open func() metrics.CgroupReader

	mu     sync.Mutex
	r      metrics.CgroupReader
	closed bool
}

func (l *lazyCgroup) reader() (metrics.CgroupReader, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("reading a closed cgroup source")
	}
	if l.r == nil {
		l.r = l.open()
	}
	return l.r, nil
}

// ReadCgroup implements metrics.CgroupReader.
func (l *lazyCgroup) ReadCgroup(r *metrics.Reading) error {
	cr, err := l.reader()
	if err != nil {
		return err
	}
	return cr.ReadCgroup(r)
}

// Has and LocalOOM forward metrics' optional interface of partial
// readers (a v2 group without some controllers' files).
func (l *lazyCgroup) Has() (memory, pids bool) {
	if cr, err := l.reader(); err == nil {
		if p, ok := cr.(interface{ Has() (bool, bool) }); ok {
			return p.Has()
		}
	}
	return true, true
}

func (l *lazyCgroup) LocalOOM() bool {
	if cr, err := l.reader(); err == nil {
		if p, ok := cr.(interface{ LocalOOM() bool }); ok {
			return p.LocalOOM()
		}
	}
	return false
}

// Close implements io.Closer: it closes the files, if they were opened.
func (l *lazyCgroup) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if c, ok := l.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// diskCache reads a sandbox's disk use at most every diskEvery: it asks
// the filesystem, which is dearer than the cgroup files, and it changes
// slowly.
type diskCache struct {
	id         string
	read       func(id string) (int64, int64, error)
	at         time.Time
	used, size int64
}

const diskEvery = 10 * time.Second

func (d *diskCache) Usage() (int64, int64, error) {
	if now := time.Now(); now.Sub(d.at) >= diskEvery {
		u, s, err := d.read(d.id)
		if err != nil {
			return 0, 0, err
		}
		d.at, d.used, d.size = now, u, s
	}
	return d.used, d.size, nil
}

func budgetSpec(b *api.Budget) budget.Spec {
	return budget.Spec{CPUSeconds: b.CPUSeconds, WallSeconds: float64(b.WallSeconds), EgressBytes: float64(b.EgressBytes),
		EgressRequests: float64(b.EgressRequests), Cost: b.Cost, WarnAt: b.WarnAt, Action: budget.Action(b.Action)}
}

// setBudget gives the tracker s's budgets; with restore, the usage saved
// when it last stopped carries on.
func (h *Hub) setBudget(id string, s api.Sandbox, restore bool) {
	if s.Budget == nil {
		return
	}
	spec := budgetSpec(s.Budget)
	if err := spec.Validate(); err != nil {
		h.log.Warn("sandbox budget refused", "sandbox", id, "err", err)
		return
	}
	var u *budget.Usage
	if restore {
		u = h.loadUsage(id)
	}
	if err := h.budgets.Set(id, spec, s.CreatedAt, u); err != nil {
		h.log.Warn("setting sandbox budget", "sandbox", id, "err", err)
	}
}

func (h *Hub) setAutoscale(id string, s api.Sandbox) {
	if s.Autoscale == nil {
		return
	}
	a := s.Autoscale
	r := autoscale.Range{MinMemoryBytes: a.MinMemoryBytes, MaxMemoryBytes: a.MaxMemoryBytes, MinCPUs: a.MinCPUs, MaxCPUs: a.MaxCPUs}
	if err := h.scaler.Set(id, r, limitsOf(s.Resources)); err != nil {
		h.log.Warn("setting sandbox autoscale", "sandbox", id, "err", err)
	}
}

func limitsOf(r api.Resources) cgroup.Limits {
	return cgroup.Limits{CPUs: r.CPUs, MemoryBytes: r.MemoryBytes, Pids: r.Pids}
}

// applyLimits is the autoscaler's hand on a sandbox's cgroup.
func (h *Hub) applyLimits(id string, l cgroup.Limits) error {
	h.mu.Lock()
	var g *cgroup.Group
	if st := h.boxes[id]; st != nil {
		g = st.group
	}
	h.mu.Unlock()
	if g == nil {
		return errdefs.Conflict("sandbox %s is not running", id)
	}
	return g.Update(l)
}

// Stopped implements sandbox.Observer.
func (h *Hub) Stopped(s api.Sandbox) {
	id := s.ID
	h.sampler.Unregister(id)
	h.adm.Release(id)
	h.saveUsage(id)
	h.budgets.Remove(id)
	h.scaler.Remove(id)
	h.oom.Forget(id)
	h.mu.Lock()
	if st := h.boxes[id]; st != nil {
		st.group = nil
	}
	h.mu.Unlock()
}

// Removed implements sandbox.Observer.
func (h *Hub) Removed(id string) {
	h.sampler.Forget(id)
	h.nets.Remove(id)
	h.usageMu.Lock()
	h.budgets.Remove(id)
	os.Remove(h.usagePath(id))
	h.usageMu.Unlock()
	h.scaler.Remove(id)
	h.adm.Release(id)
	h.oom.Forget(id)
	if err := h.events.Remove(id); err != nil {
		h.log.Warn("removing event log", "sandbox", id, "err", err)
	}
	if err := h.execs.Remove(id); err != nil {
		h.log.Warn("removing exec log", "sandbox", id, "err", err)
	}
	h.mu.Lock()
	delete(h.boxes, id)
	h.boxes = shrink.Map(h.boxes, &h.boxesPeak)
	h.mu.Unlock()
	h.col.Deleted()
}

// Resize implements sandbox.Observer: a growth must fit on the host.
func (h *Hub) Resize(id string, res api.Resources) error {
	if err := h.fitsHost(res); err != nil {
		return err
	}
	return h.adm.Resize(id, admission.Resources{CPUs: res.CPUs, MemoryBytes: res.MemoryBytes})
}

// Changed implements sandbox.Observer: new limits, budgets or autoscale
// range.
func (h *Hub) Changed(s api.Sandbox) {
	id := s.ID
	h.mu.Lock()
	st := h.boxes[id]
	if st == nil {
		st = &state{res: s.Resources}
		h.boxes[id] = st
	}
	from := st.res
	st.res, st.budget, st.autoscale = s.Resources, s.Budget, s.Autoscale
	running := st.group != nil
	h.mu.Unlock()
	if from != s.Resources {
		h.append(id, events.Event{Type: events.Limits,
			Message: fmt.Sprintf("limits set to %g CPUs, %d bytes of memory, %d pids", s.Resources.CPUs, s.Resources.MemoryBytes, s.Resources.Pids),
			Data: events.Data(events.LimitsData{CPUs: s.Resources.CPUs, MemoryBytes: s.Resources.MemoryBytes, Pids: s.Resources.Pids,
				FromCPUs: from.CPUs, FromMemoryBytes: from.MemoryBytes, FromPids: from.Pids, By: "user"})})
		if running {
			h.scaler.SetLimits(id, limitsOf(s.Resources))
		}
	}
	if running {
		h.setBudget(id, s, false)
		h.setAutoscale(id, s)
	}
}

// Event implements sandbox.Observer.
func (h *Hub) Event(id, kind, message string, data any) {
	t := events.Type(kind)
	switch message {
	case "paused", "resumed", "frozen", "thawed":
		t = events.Pause
	}
	h.append(id, events.Event{Type: t, Message: message, Data: events.Data(data)})
}

func (h *Hub) append(id string, e events.Event) {
	if _, err := h.events.Append(id, e); err != nil && !errors.Is(err, events.ErrRemoved) {
		h.log.Warn("recording event", "sandbox", id, "type", e.Type, "err", err)
	}
}

// Egress counts one egress decision of sandbox id and records it: bytes
// both ways, allowed or denied, and a policy event.
func (h *Hub) Egress(id string, allowed bool, rx, tx int64, message string, data any) {
	n := h.nets.Get(id)
	n.AddBytes(uint64(max(rx, 0)), uint64(max(tx, 0)))
	n.AddRequest(allowed)
	h.append(id, events.Event{Type: events.Policy, Message: message, Data: events.Data(data)})
}

// budgetAction runs the action of an exceeded budget, off the sampler's
// goroutine. The tracker has written the budget event already.
func (h *Hub) budgetAction(id string, n budget.Notice) {
	h.mu.Lock()
	a := h.actions
	h.mu.Unlock()
	var f func(context.Context, string) error
	switch n.Action {
	case budget.Pause:
		f = a.Pause
	case budget.Kill:
		f = a.Kill
	case budget.CutNetwork:
		f = a.CutNetwork
	}
	if f == nil {
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		ctx, cancel := context.WithTimeout(h.ctx, time.Minute)
		defer cancel()
		log := h.log.With("sandbox", id, "budget", n.Budget, "action", n.Action)
		if err := f(ctx, id); err != nil {
			log.Warn("budget action failed", "err", err)
			return
		}
		log.Info("budget reached; action taken", "used", n.Used, "limit", n.Limit)
	}()
}

func (h *Hub) usageDir() string           { return filepath.Join(h.cfg.Dir, "budgets") }
func (h *Hub) usagePath(id string) string { return filepath.Join(h.usageDir(), id+".json") }

// saveUsage keeps id's budget usage on disk, so that budgets carry on
// after a stop or a daemon restart.
func (h *Hub) saveUsage(id string) {
	h.usageMu.Lock()
	defer h.usageMu.Unlock()
	u, err := h.budgets.Usage(id)
	if err != nil {
		return // no budgets
	}
	b, _ := json.Marshal(u)
	if err := durable.Replace(h.usagePath(id), b, 0o600); err != nil {
		h.log.Warn("saving budget usage", "sandbox", id, "err", err)
	}
}

func (h *Hub) saveUsages() {
	h.mu.Lock()
	ids := make([]string, 0, len(h.boxes))
	for id, st := range h.boxes {
		if st.group != nil && st.budget != nil {
			ids = append(ids, id)
		}
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.saveUsage(id)
	}
}

func (h *Hub) loadUsage(id string) *budget.Usage {
	b, err := os.ReadFile(h.usagePath(id))
	if err != nil {
		return nil
	}
	var u budget.Usage
	if json.Unmarshal(b, &u) != nil {
		return nil
	}
	return &u
}

// Prune removes the logs of sandboxes keep does not know, after the
// manager's reconcile.
func (h *Hub) Prune(keep func(id string) bool) {
	evIDs, err1 := h.events.IDs()
	xlIDs, err2 := h.execs.IDs()
	if err := errors.Join(err1, err2); err != nil {
		h.log.Warn("listing telemetry logs", "err", err)
	}
	for _, id := range append(evIDs, xlIDs...) {
		if !keep(id) {
			h.events.Remove(id)
			h.execs.Remove(id)
			os.Remove(h.usagePath(id))
		}
	}
}
