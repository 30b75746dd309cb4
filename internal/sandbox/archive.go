package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// A paused sandbox can be archived to the object store (Config.Archive):
// its disk is captured, streamed to the store and checked there, its
// record written beside it, and only then is the local disk removed. The
// node keeps the record as a stub (record.Archived set, no disk, no uid
// range): the sandbox is still listed, paused, and resuming it restores
// its disk from the store. A node that has never seen the sandbox (its
// own node is gone) restores it on Resume from the store's record alone
// (Restore): the id stays the same.

var errNoArchive = errdefs.New(errdefs.ErrUnavailable, "no archive store is configured (paddock serve --archive-endpoint)")

// Archive moves paused sandbox id's disk to the object store.
func (m *Manager) Archive(ctx context.Context, id string) (api.Sandbox, error) {
	if m.cfg.Archive == nil {
		return api.Sandbox{}, errNoArchive
	}
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := m.archiveLocked(ctx, b); err != nil {
		return api.Sandbox{}, err
	}
	return b.viewLocked(), nil
}

func (m *Manager) archiveLocked(ctx context.Context, b *box) error {
	id := b.rec.ID
	switch {
	case b.rec.ArchivedDisk != nil:
		return nil
	case b.rec.State != api.StatePaused:
		return errdefs.Conflict("sandbox %s is %s: only a paused sandbox is archived; pause it first", id, b.rec.State)
	case len(b.rec.Volumes) > 0:
		return errdefs.Conflict("sandbox %s mounts volumes, which stay on their node: it cannot be archived", id)
	case m.cfg.Snapshots == nil:
		return errNoSnapshots
	}
	start := time.Now()
	p, err := m.cfg.Snapshots.Begin()
	if err != nil {
		return err
	}
	defer p.Abort() // the capture is only a means here
	if _, err := m.captureLocked(ctx, b, p.Path); err != nil {
		return err
	}
	captured := time.Since(start)
	disk, err := m.cfg.Archive.PutDisk(ctx, id, p.Path)
	if err != nil {
		return fmt.Errorf("archiving %s: %w", id, err)
	}
	kept := b.rec
	kept.Runtime, kept.UIDBase = nil, 0
	raw, err := json.Marshal(kept)
	if err != nil {
		return err
	}
	rec := archive.Record{ID: id, Sandbox: raw, Node: m.cfg.Node, Disk: &disk, ArchivedAt: time.Now().UTC()}
	if err := m.cfg.Archive.Put(ctx, rec); err != nil {
		return fmt.Errorf("archiving %s: %w", id, err)
	}
	// Read back before the local copy goes.
	got, err := m.cfg.Archive.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("archiving %s: checking the record: %w", id, err)
	}
	if got.Disk == nil || *got.Disk != disk {
		return errdefs.New(errdefs.ErrUnavailable, "archiving %s: the store's record differs from the one written", id)
	}
	b.rec.ArchivedDisk = &disk
	m.persistLocked(b)
	if err := m.cfg.Runtime.Remove(ctx, id); err != nil {
		// The archive holds it; the local leftovers go at the next start.
		m.log.Warn("removing an archived sandbox's local disk", "sandbox", id, "err", err)
	}
	m.freeRange(b)
	m.persistLocked(b)
	m.notify(b).Event(id, "lifecycle", "archived", map[string]any{"bytes": disk.Bytes, "data": disk.Data})
	m.log.Info("sandbox archived", "sandbox", id, "store", m.cfg.Archive.Endpoint(), "data", disk.Data, "bytes", disk.Bytes,
		"capture", captured.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// freeRange gives back an archived sandbox's uid range: a resume takes
// another.
func (m *Manager) freeRange(b *box) {
	m.mu.Lock()
	if base := b.rec.UIDBase; base != 0 && m.slots[m.slotOf(base)] == b.rec.ID {
		delete(m.slots, m.slotOf(base))
	}
	m.mu.Unlock()
	b.rec.UIDBase = 0
}

// startArchivedLocked restores b's disk from the archive and starts it;
// the archived disk is deleted once the sandbox runs here.
func (m *Manager) startArchivedLocked(ctx context.Context, b *box, to api.State) error {
	id := b.rec.ID
	if m.cfg.Archive == nil {
		return fmt.Errorf("resuming %s: its disk is archived: %w", id, errNoArchive)
	}
	if m.cfg.Snapshots == nil {
		return errNoSnapshots
	}
	start := time.Now()
	p, err := m.cfg.Snapshots.Begin()
	if err != nil {
		return err
	}
	defer p.Abort() // the sandbox's disk is a copy (a reflink) of it
	f, err := os.OpenFile(p.Path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = m.cfg.Archive.GetDisk(ctx, id, *b.rec.ArchivedDisk, f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("resuming %s: %w", id, err)
	}
	fetched := time.Since(start)
	disk := *b.rec.ArchivedDisk
	b.rec.ArchivedDisk = nil
	if err := m.startFromLocked(ctx, b, to, p.Path); err != nil {
		b.rec.ArchivedDisk = &disk
		return err
	}
	// The sandbox runs here now: the archive keeps only a pointer to
	// this node, for gateways that route by the id's old tag.
	m.persistLocked(b)
	m.unarchive(id) // before the answer: the gateways' next lookup finds this node
	m.log.Info("sandbox restored from the archive", "sandbox", id, "data", disk.Data, "fetch", fetched.Round(time.Millisecond),
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// unarchive leaves in the store a record that names this node and no
// disk.
func (m *Manager) unarchive(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := m.cfg.Archive.Get(ctx, id)
	if err == nil {
		rec.Node, rec.Disk, rec.Sandbox = m.cfg.Node, nil, nil
		err = m.cfg.Archive.Put(ctx, rec)
	}
	if err == nil {
		err = m.cfg.Archive.DeleteDisk(ctx, id)
	}
	if err != nil {
		m.log.Warn("pointing the archive at this node", "sandbox", id, "err", err)
	}
}

// Restore takes in sandbox id from the archive, as a paused stub, when
// this node has no record of it (its own node is gone); the caller then
// resumes it. A sandbox the archive says another node holds is refused.
func (m *Manager) restore(ctx context.Context, id string) (*box, error) {
	rec, err := m.cfg.Archive.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if rec.Disk == nil {
		return nil, errdefs.Conflict("sandbox %s was restored on node %s; call it there", id, rec.Node)
	}
	var r record
	if err := json.Unmarshal(rec.Sandbox, &r); err != nil || r.ID != id {
		return nil, errdefs.New(errdefs.ErrInvalid, "the archived record of %s is corrupt", id)
	}
	r.State, r.Runtime, r.UIDBase, r.Error, r.Node = api.StatePaused, nil, 0, "", m.cfg.Node
	r.ArchivedDisk = rec.Disk
	if len(r.Volumes) > 0 {
		return nil, errdefs.New(errdefs.ErrInvalid, "the archived record of %s mounts volumes", id)
	}
	if _, err := m.cfg.Images.Get(imageRef(r.Sandbox)); err != nil {
		return nil, fmt.Errorf("restoring %s: %w", id, err)
	}
	b := &box{rec: r}
	m.mu.Lock()
	if old, ok := m.boxes[id]; ok {
		m.mu.Unlock()
		if old.gone {
			return nil, errdefs.Conflict("sandbox %s is being removed here", id)
		}
		return old, nil
	}
	m.boxes[id] = b
	m.mu.Unlock()
	if err := m.cfg.Store.Put(bucket, id, b.rec); err != nil {
		m.forget(id)
		return nil, fmt.Errorf("recording %s: %w", id, err)
	}
	m.log.Info("sandbox taken in from the archive", "sandbox", id, "from_node", rec.Node)
	return b, nil
}

// lookupOrRestore is lookup that, for a sandbox this node has no record
// of, takes it in from the archive (a resume through a gateway that
// placed it here).
func (m *Manager) lookupOrRestore(ctx context.Context, id string) (*box, error) {
	b, err := m.lookup(id)
	if err == nil || m.cfg.Archive == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return b, err
	}
	rb, rerr := m.restore(ctx, id)
	if rerr != nil {
		if errors.Is(rerr, errdefs.ErrNotFound) {
			return nil, err
		}
		return nil, rerr
	}
	return rb, nil
}

// dropArchive deletes what the store holds of a removed sandbox, unless
// the store says another node took it in meanwhile (this node was gone
// then). A store that does not answer leaves the objects behind, logged:
// the removal goes on.
//
// It runs behind the teardown: a slow store does not hold the removal.
func (m *Manager) dropArchive(b *box) {
	if b.rec.ArchivedDisk == nil || m.cfg.Archive == nil {
		return
	}
	go m.dropArchived(b.rec.ID)
}

func (m *Manager) dropArchived(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rec, err := m.cfg.Archive.Get(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		return
	case err == nil && rec.Node != m.cfg.Node:
		m.log.Info("an archived sandbox removed here lives on another node; its archive stays", "sandbox", id, "node", rec.Node)
		return
	case err == nil:
		err = m.cfg.Archive.Delete(ctx, id)
	}
	if err != nil {
		m.log.Warn("deleting a removed sandbox's archive; its objects stay in the store", "sandbox", id, "err", err)
	}
}

// archiveIdle archives paused sandboxes that have been idle for longer
// than after (the daemon's --archive-after), one at a time.
func (m *Manager) archiveIdle(after time.Duration, now time.Time) {
	m.mu.Lock()
	boxes := make([]*box, 0, len(m.boxes))
	for _, b := range m.boxes {
		boxes = append(boxes, b)
	}
	m.mu.Unlock()
	for _, b := range boxes {
		if !b.mu.TryLock() {
			continue
		}
		if b.rec.State == api.StatePaused && b.rec.ArchivedDisk == nil && len(b.rec.Volumes) == 0 && b.idleFor(now) >= after {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			if err := m.archiveLocked(ctx, b); err != nil {
				m.log.Warn("archiving an idle paused sandbox", "sandbox", b.rec.ID, "err", err)
			}
			cancel()
		}
		b.mu.Unlock()
	}
}

func (m *Manager) archiveLoop(after time.Duration) {
	defer m.wg.Done()
	t := time.NewTicker(min(after/2, 10*time.Second))
	defer t.Stop()
	for {
		select {
		case <-m.closed:
			return
		case now := <-t.C:
			m.archiveIdle(after, now)
		}
	}
}
