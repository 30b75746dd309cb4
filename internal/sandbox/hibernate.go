package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// touch records activity on the sandbox (an API call that reached it).
func (b *box) touch() {
	b.activity.Lock()
	b.lastActive = time.Now()
	b.activity.Unlock()
}

// Busy marks a stream open on the sandbox: it is active until the
// returned func is called.
func (m *Manager) Busy(id string) func() {
	b, err := m.lookup(id)
	if err != nil {
		return func() {}
	}
	b.activity.Lock()
	b.streams++
	b.lastActive = time.Now()
	b.activity.Unlock()
	return func() {
		b.activity.Lock()
		b.streams--
		b.lastActive = time.Now()
		b.activity.Unlock()
	}
}

// Touch records activity on a sandbox that the API did not see, such as
// network traffic through the egress proxy.
func (m *Manager) Touch(id string) {
	if b, err := m.lookup(id); err == nil {
		b.touch()
	}
}

// idleFor reports how long the sandbox has had no activity and no open
// stream (0 while a stream is open).
func (b *box) idleFor(now time.Time) time.Duration {
	b.activity.Lock()
	defer b.activity.Unlock()
	if b.streams > 0 || b.lastActive.IsZero() {
		return 0
	}
	return now.Sub(b.lastActive)
}

// wakeLocked brings a paused or frozen sandbox back for an API call that
// needs it running, when the sandbox allows that.
func (m *Manager) wakeLocked(ctx context.Context, b *box) error {
	if !b.rec.AutoResume {
		return nil
	}
	mv, err := next(b, actWake)
	if err != nil {
		return err
	}
	switch mv.step {
	case stepThaw:
		return m.thawLocked(b, mv.to)
	case stepStart:
		return m.startLocked(ctx, b, mv.to)
	}
	return nil
}

// Pause hibernates a sandbox: its memory and CPU are released; its files,
// environment, limits and policy are kept, and Resume brings it back with
// the same id. On a runtime that checkpoints (gvisor) its processes are
// kept too, on its disk, and a resume continues them; on native they end.
// The record's Paused says which.
func (m *Manager) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := m.pauseLocked(ctx, b, actPause); err != nil {
		return api.Sandbox{}, err
	}
	return b.viewLocked(), nil
}

// pauseLocked pauses b on request (actPause) or because it is idle
// (actIdle).
func (m *Manager) pauseLocked(ctx context.Context, b *box, act action) error {
	mv, err := next(b, act)
	if err != nil || mv.step == stepNone {
		return err
	}
	start := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(start).Round(time.Microsecond).String()) }
	defer func() { m.log.Debug("pause phases", append([]any{"sandbox", b.rec.ID}, phases...)...) }()
	kept, err := m.checkpointLocked(ctx, b)
	if err != nil {
		return err
	}
	mark("checkpointed")
	if kept.Memory {
		err = m.endCheckpointedLocked(ctx, b)
	} else {
		err = m.stopLocked(ctx, b)
	}
	if err != nil {
		return err
	}
	mark("stopped")
	kept.At = time.Now().UTC()
	kept.TookMillis = time.Since(start).Milliseconds()
	b.rec.Paused = kept
	b.rec.State = mv.to
	b.rec.Error = ""
	m.persistLocked(b)
	mark("recorded")
	m.notify(b).Stopped(b.viewLocked())
	m.notify(b).Event(b.rec.ID, "lifecycle", "paused", nil)
	m.log.Info("sandbox paused", "sandbox", b.rec.ID, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// checkpointLocked writes b's processes to its disk when its runtime
// can (they are stopped then, and stopLocked ends them), and says what
// the pause keeps. A checkpoint that fails leaves b running, as it was,
// and the error says why.
func (m *Manager) checkpointLocked(ctx context.Context, b *box) (*api.PauseInfo, error) {
	c, ok := m.cfg.Runtime.(runtime.Checkpointer)
	if !ok || b.inst == nil {
		return &api.PauseInfo{}, nil
	}
	frozen := b.rec.State == api.StateFrozen
	if frozen {
		// The checkpoint is the sandbox's kernel's work: it must run.
		if err := b.inst.Thaw(); err != nil {
			return nil, fmt.Errorf("thawing %s: %w", b.rec.ID, err)
		}
	}
	ck, err := c.Checkpoint(ctx, b.rec.ID)
	switch {
	case err == nil:
		m.log.Info("sandbox checkpointed", "sandbox", b.rec.ID, "bytes", ck.Bytes, "memory", ck.MemoryBytes, "took", ck.Took.Round(time.Microsecond))
		info := &api.PauseInfo{Memory: true, CheckpointBytes: ck.Bytes, MemoryBytes: ck.MemoryBytes, Compressing: ck.Squeezed != nil}
		if ck.Squeezed != nil {
			go m.settleCheckpoint(b, info, ck.Squeezed)
		}
		return info, nil
	case errors.Is(err, runtime.ErrNoCheckpoint):
		return &api.PauseInfo{}, nil
	}
	if frozen {
		b.inst.Freeze(context.Background())
	}
	m.log.Warn("checkpointing", "sandbox", b.rec.ID, "err", err)
	return nil, fmt.Errorf("%w: pausing %s with its memory: %v; it runs on", errdefs.ErrConflict, b.rec.ID, err)
}

// endCheckpointedLocked is stopLocked for b once its processes are
// checkpointed: they are stopped (the runtime paused them for the save)
// and signalled, so they can never run again, but not waited for: their
// exit (the kernel freeing the memory they held, most of a second for
// 512 MiB on a busy host) and the removal of their cgroup are the
// runtime's, behind the answer, before the sandbox's next start or
// removal (runtime.Checkpointer).
func (m *Manager) endCheckpointedLocked(ctx context.Context, b *box) error {
	if err := m.stopMembers(ctx, b); err != nil {
		return err
	}
	b.stopping = true
	if err := b.inst.Kill(); err != nil {
		return fmt.Errorf("killing sandbox: %w", err)
	}
	b.detach()
	if err := m.cfg.Runtime.Stop(ctx, b.rec.ID); err != nil {
		return fmt.Errorf("stopping sandbox: %w", err)
	}
	return nil
}

// settleCheckpoint records the size of b's checkpoint once its runtime
// has compressed it behind the pause's answer, if that pause (info)
// still holds.
func (m *Manager) settleCheckpoint(b *box, info *api.PauseInfo, squeezed <-chan int64) {
	n, ok := <-squeezed
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.Paused != info {
		return
	}
	settled := *info // views share the record's
	settled.Compressing = false
	if ok {
		settled.CheckpointBytes = n
	}
	b.rec.Paused = &settled
	m.persistLocked(b)
}

// Resume starts a paused or stopped sandbox again with the same id, files,
// environment and limits, or thaws a frozen one.
func (m *Manager) Resume(ctx context.Context, id string) (api.Sandbox, error) {
	b, taken, err := m.lookupOrRestore(ctx, id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	mv, err := next(b, actResume)
	switch {
	case err != nil:
	case mv.step == stepThaw:
		err = m.thawLocked(b, mv.to)
	case mv.step == stepStart:
		err = m.startLocked(ctx, b, mv.to)
	}
	if err != nil {
		if taken {
			m.dropTaken(b)
		}
		return api.Sandbox{}, err
	}
	return b.viewLocked(), nil
}

// startLocked starts the sandbox's guest again on its disk and uid range;
// it is then in state to.
func (m *Manager) startLocked(ctx context.Context, b *box, to api.State) error {
	if b.rec.ArchivedDisk != nil {
		return m.startArchivedLocked(ctx, b, to)
	}
	return m.startFromLocked(ctx, b, to, "", nil)
}

// startFromLocked is startLocked; diskFrom, if set, is an image file
// whose copy becomes the sandbox's disk (it has none here), and
// memberDisks those of its members, by name.
func (m *Manager) startFromLocked(ctx context.Context, b *box, to api.State, diskFrom string, memberDisks map[string]string) error {
	img, err := m.cfg.Images.Get(imageRef(b.rec.Sandbox))
	if err != nil {
		return fmt.Errorf("resuming %s: %w", b.rec.ID, err)
	}
	start := time.Now()
	spec := m.spec(&b.rec, img)
	spec.ID = b.rec.ID
	spec.Held = true // activated once recorded, below
	spec.DiskFrom = diskFrom
	spec.FromCheckpoint = b.rec.State == api.StatePaused && b.rec.Paused != nil && b.rec.Paused.Memory
	if spec.Mounts, err = m.mounts(ctx, b.rec.ID, b.rec.Volumes); err != nil {
		return fmt.Errorf("resuming %s: %w", b.rec.ID, err)
	}
	if err := m.withControl(&spec, &b.rec, 0); err != nil {
		return fmt.Errorf("resuming %s: %w", b.rec.ID, err)
	}
	if err := m.notify(b).Admit(b.rec.ID, b.rec.Resources); err != nil {
		return err
	}
	inst, err := m.startInstance(ctx, spec)
	if err != nil {
		m.notify(b).Release(b.rec.ID)
		if spec.FromCheckpoint && errors.Is(err, runtime.ErrCheckpointUnusable) {
			// Its files are intact: the next resume starts it from them.
			b.rec.Paused.Memory = false
			b.rec.Paused.Lost = err.Error()
			m.persistLocked(b)
			return fmt.Errorf("%w: resuming %s: %v; its files are kept: resume again to start it from them, without its processes",
				errdefs.ErrConflict, b.rec.ID, err)
		}
		return fmt.Errorf("resuming %s: %w", b.rec.ID, err)
	}
	b.attach(inst, m.guestClient(inst))
	b.touch()
	if base := inst.Info().UIDBase; base != b.rec.UIDBase {
		m.rebase(b, base)
	}
	if err := m.startMembers(ctx, b, nil, memberDisks); err != nil {
		b.stopping = true
		inst.Kill()
		<-inst.Done()
		b.detach()
		if serr := m.cfg.Runtime.Stop(ctx, b.rec.ID); serr != nil {
			m.log.Warn("releasing a sandbox that did not resume", "sandbox", b.rec.ID, "err", serr)
		}
		m.notify(b).Release(b.rec.ID)
		return fmt.Errorf("resuming %s: %w", b.rec.ID, err)
	}
	m.claimSlots(b)
	was, paused := b.rec.State, b.rec.Paused
	b.rec.State = to
	b.rec.Error = ""
	b.rec.Paused = nil
	b.rec.Runtime = inst.State()
	m.persistLocked(b)
	m.watch(b, inst)
	activate(inst)
	if len(b.rec.Containers) > 0 {
		// Listed as it was until its services are up and ready.
		shown := b.viewLocked()
		shown.State = was
		b.shown.Store(&shown)
		m.activateMembers(b)
		b.rec.Containers[0].State = api.StateRunning
		if err := m.startServices(ctx, b); err != nil {
			return m.unresumeLocked(ctx, b, was, paused, err)
		}
		m.superviseAll(b)
		m.persistLocked(b)
	}
	m.notify(b).Running(b.rec.ID, b.viewLocked())
	m.notify(b).Event(b.rec.ID, "lifecycle", "resumed", nil)
	m.log.Info("sandbox resumed", "sandbox", b.rec.ID, "memory", spec.FromCheckpoint, "took", time.Since(start).Round(time.Microsecond))
	return nil
}

// unresumeLocked stops a sandbox of several containers whose services did
// not start or get ready on a resume: it is left as it was (state was,
// paused), with why in its error, its files kept for the next resume.
func (m *Manager) unresumeLocked(ctx context.Context, b *box, was api.State, paused *api.PauseInfo, why error) error {
	m.log.Warn("resumed sandbox's services are not ready; stopping it again", "sandbox", b.rec.ID, "err", why)
	if err := m.stopLocked(ctx, b); err != nil {
		m.log.Warn("stopping a sandbox that did not resume", "sandbox", b.rec.ID, "err", err)
	}
	b.rec.State, b.rec.Paused, b.rec.Error = was, paused, why.Error()
	m.persistLocked(b)
	m.notify(b).Release(b.rec.ID)
	m.notify(b).Event(b.rec.ID, "lifecycle", "resume failed", map[string]any{"error": why.Error()})
	return fmt.Errorf("resuming %s: %w", b.rec.ID, why)
}

// Freeze stops a sandbox's processes in place with the cgroup freezer: the
// cheap pause for seconds to minutes (memory is kept).
func (m *Manager) Freeze(ctx context.Context, id string) (api.Sandbox, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	mv, err := next(b, actFreeze)
	if err != nil {
		return api.Sandbox{}, err
	}
	if mv.step == stepFreeze {
		if err := b.inst.Freeze(ctx); err != nil {
			return api.Sandbox{}, fmt.Errorf("freezing %s: %w", id, err)
		}
		b.rec.State = mv.to
		m.persistLocked(b)
		m.notify(b).Event(id, "lifecycle", "frozen", nil)
	}
	return b.viewLocked(), nil
}

// Thaw lets a frozen sandbox's processes run again.
func (m *Manager) Thaw(ctx context.Context, id string) (api.Sandbox, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	mv, err := next(b, actThaw)
	if err != nil {
		return api.Sandbox{}, err
	}
	if mv.step == stepThaw {
		if err := m.thawLocked(b, mv.to); err != nil {
			return api.Sandbox{}, err
		}
	}
	return b.viewLocked(), nil
}

// thawLocked lets b's processes run again; it is then in state to.
func (m *Manager) thawLocked(b *box, to api.State) error {
	if err := b.inst.Thaw(); err != nil {
		return fmt.Errorf("thawing %s: %w", b.rec.ID, err)
	}
	b.rec.State = to
	b.touch()
	m.persistLocked(b)
	m.notify(b).Event(b.rec.ID, "lifecycle", "thawed", nil)
	return nil
}

// autoPause pauses running sandboxes that have been idle for longer than
// their auto-pause time. It runs until the manager closes.
func (m *Manager) autoPause(every time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.closed:
			return
		case now := <-t.C:
			boxes := m.allBoxes()
			for _, b := range boxes {
				m.pauseIfIdle(b, now)
			}
		}
	}
}

func (m *Manager) pauseIfIdle(b *box, now time.Time) {
	if !b.mu.TryLock() {
		return // busy: not idle
	}
	defer b.mu.Unlock()
	limit := time.Duration(b.rec.AutoPauseSeconds) * time.Second
	if _, err := next(b, actIdle); err != nil || limit <= 0 || b.idleFor(now) < limit {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.pauseLocked(ctx, b, actIdle); err != nil {
		m.log.Warn("auto-pausing", "sandbox", b.rec.ID, "err", err)
		return
	}
	m.log.Info("sandbox auto-paused", "sandbox", b.rec.ID, "idle", limit)
}
