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
func (m *Manager) tearDown(b *box) {
	torn := make(chan struct{})
	m.mu.Lock()
	b.torn = torn
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(torn)
		id := b.rec.ID
		wait := time.Second
		for attempt := 1; ; attempt++ {
			select {
			case m.tearing <- struct{}{}:
			case <-m.closed:
				return // the next daemon finishes it
			}
			err := m.tearDownOnce(b, attempt)
			<-m.tearing
			if err == nil {
				return
			}
			m.log.Error("tearing down a removed sandbox; retrying", "sandbox", id, "attempt", attempt, "retry_in", wait.String(), "err", err)
			select {
			case <-time.After(wait):
			case <-m.closed:
				return
			}
			wait = min(2*wait, teardownRetryMax)
		}
	}()
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
