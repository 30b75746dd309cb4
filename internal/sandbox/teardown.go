package sandbox

import (
	"context"
	"fmt"
	"time"
)

// A removal answers once it is recorded (the record's state is removing)
// and the sandbox's guest is killed; the teardown follows here, in the
// background: the guest's death awaited, the runtime's Remove (cgroup,
// disk, run dir, network), the volumes and snapshots it mounted released,
// the record deleted, and only then its uid range and id freed, so that
// nothing is handed out again before everything it owned is gone. A
// teardown that fails is retried, with the record kept: a daemon that
// dies meanwhile finds the record at start and takes the teardown up
// again (Reconcile).

const (
	// teardownWorkers bounds the teardowns that run at once: each is
	// mostly waits on the kernel (an unmount, a loop device's release, a
	// cgroup's removal), which a burst of removals would otherwise pile
	// onto the cores the running sandboxes need.
	teardownWorkers = 4
	// teardownDeath is how long a teardown waits for a killed guest to
	// die before the runtime's Remove kills its cgroup.
	teardownDeath = 5 * time.Second
	// teardownRetryMax caps the wait between the attempts of a teardown
	// that keeps failing (1 s, 2 s, 4 s, ...).
	teardownRetryMax = time.Minute
	// settleWait bounds how long a call that needs a removed sandbox's
	// resources waits for its teardown.
	settleWait = 10 * time.Second
)

// tearDown starts the teardown of b, whose removal is recorded (b.gone).
// b.mu is held.
//
// The teardowns wait in a queue that at most teardownWorkers goroutines
// work through, rather than on a goroutine each: a thousand removals at
// once left a thousand goroutine descriptors, which the Go runtime never
// frees, and raised the peak that the daemon's memory stays near after
// they are gone (issue 21).
func (m *Manager) tearDown(b *box) {
	t := &teardown{b: b, torn: make(chan struct{}), attempt: 1, wait: time.Second}
	m.mu.Lock()
	b.torn = t.torn
	m.mu.Unlock()
	m.wg.Add(1)
	m.queueTearDown(t)
}

// teardown is one queued teardown.
type teardown struct {
	b       *box
	torn    chan struct{} // closed when it is over, or left to the next daemon
	attempt int
	wait    time.Duration // before the next attempt, if this one fails
}

// queueTearDown queues t, and starts a worker if fewer than
// teardownWorkers run.
func (m *Manager) queueTearDown(t *teardown) {
	m.tearMu.Lock()
	m.tearQueue = append(m.tearQueue, t)
	start := m.tearWorkers < teardownWorkers
	if start {
		m.tearWorkers++
	}
	m.tearMu.Unlock()
	if start {
		go m.tearWorker()
	}
}

// tearWorker runs queued teardowns until none is left. One that fails
// waits for its retry on a goroutine of its own (rare), then is queued
// again; once the manager is closed, what is left is the next daemon's
// (its record says removing).
func (m *Manager) tearWorker() {
	for {
		m.tearMu.Lock()
		if len(m.tearQueue) == 0 {
			m.tearQueue = nil // a burst's backing array goes with it
			m.tearWorkers--
			m.tearMu.Unlock()
			return
		}
		t := m.tearQueue[0]
		m.tearQueue[0] = nil
		m.tearQueue = m.tearQueue[1:]
		m.tearMu.Unlock()
		select {
		case <-m.closed:
			t.over(m)
			continue
		default:
		}
		err := m.tearDownOnce(t.b, t.attempt)
		if err == nil {
			t.over(m)
			continue
		}
		m.log.Error("tearing down a removed sandbox; retrying", "sandbox", t.b.rec.ID, "attempt", t.attempt, "retry_in", t.wait.String(), "err", err)
		go func() {
			select {
			case <-time.After(t.wait):
				t.attempt++
				t.wait = min(2*t.wait, teardownRetryMax)
				m.queueTearDown(t)
			case <-m.closed:
				t.over(m)
			}
		}()
	}
}

// over ends t: done, or left to the next daemon.
func (t *teardown) over(m *Manager) {
	close(t.torn)
	m.wg.Done()
}

// tearDownOnce removes every trace of b; it can be run again after a
// failure.
func (m *Manager) tearDownOnce(b *box, attempt int) error {
	t0 := time.Now()
	phases := []any{"sandbox", b.rec.ID, "attempt", attempt}
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { m.log.Debug("teardown phases", phases...) }()
	b.mu.Lock()
	defer b.mu.Unlock()
	mark("locked")
	id := b.rec.ID
	if b.inst != nil {
		b.stopping = true
		b.inst.Kill()
		select {
		case <-b.inst.Done():
		case <-time.After(teardownDeath):
		}
		b.detach()
		mark("dead")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.removeMembers(ctx, b); err != nil {
		return err
	}
	if err := m.cfg.Runtime.Remove(ctx, id); err != nil {
		return fmt.Errorf("removing sandbox: %w", err)
	}
	mark("removed")
	m.forgetControls(id)
	m.dropArchive(b)
	m.releaseMounts(id, b.rec.Volumes)
	if err := m.removeShared(b.rec.SharedVolumes); err != nil {
		return err
	}
	// Journaled, as the removal was: a kill -9 keeps the deletion, and
	// a host crash that loses it (before the journal's sync) brings the
	// record back as removing, and so this teardown, over nothing; it
	// takes with it any later record, so the uid range freed below is
	// not promised twice.
	if err := m.cfg.Store.DeleteQuick(bucket, id); err != nil {
		return fmt.Errorf("deleting record: %w", err)
	}
	mark("unrecorded")
	m.forget(id)
	m.notify(b).Removed(id)
	mark("done")
	return nil
}

// Settle waits until the teardowns started so far are done (or ctx
// ends): a removal's answer does not wait for them, but whatever needs
// the removed sandboxes' resources back (an image, a volume or a
// snapshot they used; a daemon stopping) does.
func (m *Manager) Settle(ctx context.Context) error {
	m.mu.Lock()
	var pending []chan struct{}
	for _, b := range m.boxes {
		if b.torn != nil {
			pending = append(pending, b.torn)
		}
	}
	m.mu.Unlock()
	for _, torn := range pending {
		select {
		case <-torn:
		case <-ctx.Done():
			return fmt.Errorf("waiting for removed sandboxes' teardowns: %w", ctx.Err())
		}
	}
	return nil
}

// settleBriefly is Settle for a call that would otherwise find a removed
// sandbox still holding what it asks for: bounded, so that a teardown that
// keeps failing delays it only so long (it then meets the holder).
func (m *Manager) settleBriefly(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	if err := m.Settle(ctx); err != nil {
		m.log.Warn("removed sandboxes still hold their resources", "err", err)
	}
}
