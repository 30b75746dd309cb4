package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/snapshot"
)

// A paused sandbox can be archived to the object store (Config.Archive):
// its disk is captured, streamed to the store and checked there, its
// record written beside it, and only then is the local disk removed. The
// node keeps the record as a stub (record.Archived set, no disk, no uid
// range): the sandbox is still listed, paused, and resuming it restores
// its disk from the store. A node that has never seen the sandbox (its
// own node is gone) restores it on Resume from the store's record alone
// (Restore): the id stays the same.
//
// A sandbox of several containers travels whole: every container's disk
// and every shared volume are captured together (its processes ended
// with the pause, so the disks hold one moment), each goes to an object
// of its own (archive.ContainerDisk, archive.SharedDisk), and a restore
// makes the shared volumes again from theirs before the containers start
// on theirs. Named volumes and directory snapshots a container mounts
// stay on their node: such a sandbox is not archived.

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
	case len(b.rec.nodeMounts()) > 0:
		return errdefs.Conflict("sandbox %s mounts volumes, which stay on their node: it cannot be archived", id)
	case m.cfg.Snapshots == nil:
		return errNoSnapshots
	}
	if snaps := m.cfg.Snapshots.List(id); len(snaps) > 0 {
		names := make([]string, len(snaps))
		for i, s := range snaps {
			names[i] = s.ID
		}
		return errdefs.Conflict("sandbox %s has snapshots on this node (%s), which are not archived with it and would not follow it: remove them first",
			id, strings.Join(names, ", "))
	}
	start := time.Now()
	p, err := m.cfg.Snapshots.Begin()
	if err != nil {
		return err
	}
	defer p.Abort() // the capture is only a means here
	if b.group() {
		_, err = m.captureGroupLocked(ctx, b, groupDisks{first: p.Path, member: p.ContainerPath, shared: p.SharedPath})
	} else {
		_, err = m.captureLocked(ctx, b, p.Path)
	}
	if err != nil {
		return err
	}
	captured := time.Since(start)
	rec := archive.Record{ID: id, Node: m.cfg.Node}
	if err := m.putDisks(ctx, b, p, &rec); err != nil {
		return fmt.Errorf("archiving %s: %w", id, err)
	}
	kept := b.rec
	kept.Runtime, kept.UIDBase = nil, 0
	kept.Members = slices.Clone(kept.Members)
	for i := range kept.Members {
		kept.Members[i].Runtime, kept.Members[i].UIDBase = nil, 0
	}
	if rec.Sandbox, err = json.Marshal(kept); err != nil {
		return err
	}
	rec.ArchivedAt = time.Now().UTC()
	if err := m.cfg.Archive.Put(ctx, rec); err != nil {
		return fmt.Errorf("archiving %s: %w", id, err)
	}
	// Read back before the local copy goes.
	got, err := m.cfg.Archive.Get(ctx, id)
	if err != nil {
		return fmt.Errorf("archiving %s: checking the record: %w", id, err)
	}
	if got.Disk == nil || *got.Disk != *rec.Disk || !maps.Equal(got.Containers, rec.Containers) || !maps.Equal(got.Shared, rec.Shared) {
		return errdefs.New(errdefs.ErrUnavailable, "archiving %s: the store's record differs from the one written", id)
	}
	b.rec.ArchivedDisk = rec.Disk
	m.persistLocked(b)
	m.dropLocal(ctx, b)
	m.persistLocked(b)
	stored, data := rec.Disk.Bytes, rec.Disk.Data
	for _, d := range slices.Concat(slices.Collect(maps.Values(rec.Containers)), slices.Collect(maps.Values(rec.Shared))) {
		stored, data = stored+d.Bytes, data+d.Data
	}
	disks := 1 + len(rec.Containers) + len(rec.Shared)
	m.notify(b).Event(id, "lifecycle", "archived", map[string]any{"bytes": stored, "data": data, "disks": disks})
	m.log.Info("sandbox archived", "sandbox", id, "store", m.cfg.Archive.Endpoint(), "disks", disks, "data", data, "bytes", stored,
		"capture", captured.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// putDisks streams every disk of b captured into p to the archive (a
// group's first, then each member's and each shared volume's) and
// describes them in rec.
func (m *Manager) putDisks(ctx context.Context, b *box, p *snapshot.Pending, rec *archive.Record) error {
	id := b.rec.ID
	d, err := m.cfg.Archive.PutDisk(ctx, id, archive.FirstDisk, p.Path)
	if err != nil {
		return err
	}
	rec.Disk = &d
	if !b.group() {
		return nil
	}
	rec.Containers, rec.Shared = map[string]archive.Disk{}, map[string]archive.Disk{}
	for _, mr := range b.rec.Members {
		if rec.Containers[mr.Name], err = m.cfg.Archive.PutDisk(ctx, id, archive.ContainerDisk(mr.Name), p.ContainerPath(mr.Name)); err != nil {
			return err
		}
	}
	for _, v := range b.rec.SharedVolumes {
		if rec.Shared[v.Name], err = m.cfg.Archive.PutDisk(ctx, id, archive.SharedDisk(v.Name), p.SharedPath(v.Name)); err != nil {
			return err
		}
	}
	return nil
}

// dropLocal removes what archived (or not restored) sandbox b keeps on
// this node: its containers' disks, its shared volumes, its control
// sockets and uid ranges. The archive holds them; what does not go is
// logged, and goes with the sandbox's removal.
func (m *Manager) dropLocal(ctx context.Context, b *box) {
	id := b.rec.ID
	if err := m.removeMembers(ctx, b); err != nil {
		m.log.Warn("removing an archived sandbox's containers' disks", "sandbox", id, "err", err)
	}
	if err := m.cfg.Runtime.Remove(ctx, id); err != nil {
		m.log.Warn("removing an archived sandbox's local disk", "sandbox", id, "err", err)
	}
	m.releaseMounts(id, b.rec.Volumes)
	if err := m.removeShared(b.rec.SharedVolumes); err != nil {
		m.log.Warn("removing an archived sandbox's shared volumes", "sandbox", id, "err", err)
	}
	if b.group() {
		m.forgetControls(id)
	}
	m.freeRange(b)
}

// freeRange gives back the uid ranges of an archived sandbox and its
// members: a resume takes others.
func (m *Manager) freeRange(b *box) {
	m.mu.Lock()
	free := func(base uint32) {
		// "": taken for a member that did not start.
		if id, ok := m.slots[m.slotOf(base)]; base != 0 && ok && (id == b.rec.ID || id == "") {
			delete(m.slots, m.slotOf(base))
		}
	}
	free(b.rec.UIDBase)
	for i := range b.rec.Members {
		free(b.rec.Members[i].UIDBase)
		b.rec.Members[i].UIDBase, b.rec.Members[i].Runtime = 0, nil
	}
	m.mu.Unlock()
	b.rec.UIDBase = 0
}

// startArchivedLocked restores b's disks from the archive and starts it;
// the archived disks are deleted once the sandbox runs here. The node
// claims the archived record first: of the nodes that resume the sandbox
// at once only one restores it (archive.Store.Claim).
func (m *Manager) startArchivedLocked(ctx context.Context, b *box, to api.State) error {
	id := b.rec.ID
	if m.cfg.Archive == nil {
		return fmt.Errorf("resuming %s: its disk is archived: %w", id, errNoArchive)
	}
	if m.cfg.Snapshots == nil {
		return errNoSnapshots
	}
	start := time.Now()
	c, err := m.cfg.Archive.Claim(ctx, id, m.cfg.Node)
	if err != nil {
		m.dropStale(b, err)
		return fmt.Errorf("resuming %s: %w", id, err)
	}
	restored := false
	defer func() {
		if restored {
			return
		}
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := m.cfg.Archive.Release(rctx, c); err != nil {
			m.log.Warn("releasing the claim of an archived sandbox; it holds for "+archive.ClaimTTL.String(), "sandbox", id, "err", err)
		}
	}()
	if err := archivedParts(b, c.Record); err != nil {
		return err
	}
	p, err := m.cfg.Snapshots.Begin()
	if err != nil {
		return err
	}
	defer p.Abort() // the sandbox's disks are copies (reflinks) of them
	if err := m.getDisks(ctx, b, c.Record, p); err != nil {
		return fmt.Errorf("resuming %s: %w", id, err)
	}
	fetched := time.Since(start)
	var memberDisks map[string]string
	if b.group() {
		memberDisks = map[string]string{}
		for _, mr := range b.rec.Members {
			memberDisks[mr.Name] = p.ContainerPath(mr.Name)
		}
		if err := m.makeArchivedShared(ctx, b, p); err != nil {
			return fmt.Errorf("resuming %s: %w", id, err)
		}
	}
	was := b.rec.ArchivedDisk
	b.rec.ArchivedDisk = nil
	if err := m.startFromLocked(ctx, b, to, p.Path, memberDisks); err != nil {
		// The archive holds it: what the restore made here goes.
		b.rec.ArchivedDisk = was
		m.dropLocal(context.Background(), b)
		m.persistLocked(b)
		return err
	}
	restored = true
	// The sandbox runs here now: the archive keeps only a pointer to
	// this node, for gateways that route by the id's old tag; written
	// before the answer, so that their next lookup finds this node.
	m.persistLocked(b)
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if err := m.cfg.Archive.Restored(rctx, c); err != nil {
		m.log.Warn("pointing the archive at this node", "sandbox", id, "err", err)
	}
	cancel()
	m.log.Info("sandbox restored from the archive", "sandbox", id, "disks", 1+len(c.Containers)+len(c.Shared), "data", c.Disk.Data,
		"fetch", fetched.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// archivedParts checks that archived record rec holds a disk for each of
// b's containers beside the first and each of its shared volumes, and no
// other.
func archivedParts(b *box, rec archive.Record) error {
	corrupt := func(format string, a ...any) error {
		return errdefs.New(errdefs.ErrInvalid, "the archived record of %s is corrupt: %s", b.rec.ID, fmt.Sprintf(format, a...))
	}
	if len(rec.Containers) != len(b.rec.Members) || len(rec.Shared) != len(b.rec.SharedVolumes) {
		return corrupt("it holds %d container disks and %d shared volumes, the sandbox has %d and %d",
			len(rec.Containers), len(rec.Shared), len(b.rec.Members), len(b.rec.SharedVolumes))
	}
	for _, mr := range b.rec.Members {
		if _, ok := rec.Containers[mr.Name]; !ok {
			return corrupt("it holds no disk of container %s", mr.Name)
		}
	}
	for _, v := range b.rec.SharedVolumes {
		if _, ok := rec.Shared[v.Name]; !ok {
			return corrupt("it holds no disk of shared volume %s", v.Name)
		}
	}
	return nil
}

// getDisks writes every disk archived record rec describes into p where
// a capture would (the first's at p.Path), each checked.
func (m *Manager) getDisks(ctx context.Context, b *box, rec archive.Record, p *snapshot.Pending) error {
	get := func(object string, d archive.Disk, path string) error {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		err = m.cfg.Archive.GetDisk(ctx, rec.ID, object, d, f)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}
	if err := get(archive.FirstDisk, *rec.Disk, p.Path); err != nil {
		return err
	}
	for _, mr := range b.rec.Members {
		if err := get(archive.ContainerDisk(mr.Name), rec.Containers[mr.Name], p.ContainerPath(mr.Name)); err != nil {
			return err
		}
	}
	for _, v := range b.rec.SharedVolumes {
		if err := get(archive.SharedDisk(v.Name), rec.Shared[v.Name], p.SharedPath(v.Name)); err != nil {
			return err
		}
	}
	return nil
}

// makeArchivedShared makes b's shared volumes again from their images in
// p. One a failed restore here left behind (made for this sandbox,
// mounted by nothing) is replaced.
func (m *Manager) makeArchivedShared(ctx context.Context, b *box, p *snapshot.Pending) error {
	if len(b.rec.SharedVolumes) > 0 && m.cfg.Volumes == nil {
		return errdefs.New(errdefs.ErrUnavailable, "volumes are not configured")
	}
	from := map[string]string{}
	for _, v := range b.rec.SharedVolumes {
		from[v.Name] = p.SharedPath(v.Name)
		if old, err := m.cfg.Volumes.Get(v.Volume); err == nil && old.Labels[sharedByLabel] == b.rec.ID {
			if err := m.cfg.Volumes.Remove(ctx, v.Volume); err != nil {
				return fmt.Errorf("replacing shared volume %s: %w", v.Name, err)
			}
		}
	}
	return m.makeShared(ctx, &group{shared: b.rec.SharedVolumes, sharedFrom: from})
}

// dropStale lets go of stub b (b.mu held) when the archive no longer
// holds it for this node (err says so): another node took it in (a
// MovedError: calls for it answer that from now on, for gateways to
// follow), or it was removed there. Any other error keeps the stub.
func (m *Manager) dropStale(b *box, err error) {
	id := b.rec.ID
	var mv *errdefs.MovedError
	switch {
	case errors.As(err, &mv):
		m.log.Info("an archived sandbox this node held a stub of runs on another node: the stub goes", "sandbox", id, "node", mv.Node)
		if perr := m.cfg.Store.Put(movedBucket, id, mv.Node); perr != nil {
			m.log.Warn("recording where an archived sandbox went", "sandbox", id, "err", perr)
		}
	case errors.Is(err, errdefs.ErrNotFound):
		m.log.Info("an archived sandbox this node held a stub of is gone from the archive: the stub goes", "sandbox", id)
	default:
		return
	}
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	m.mu.Lock()
	b.gone = true
	if mv != nil {
		m.moved[id] = mv.Node
	}
	m.mu.Unlock()
	if derr := m.cfg.Store.Delete(bucket, id); derr != nil {
		m.log.Warn("deleting a stale stub's record", "sandbox", id, "err", derr)
	}
	m.forget(id)
	m.notify(b).Removed(id)
}

// movedBucket keeps, per archived sandbox another node took in, that
// node's name.
const movedBucket = "moved"

func (m *Manager) loadMoved() error {
	return m.cfg.Store.Each(movedBucket, func(id string, raw json.RawMessage) error {
		var node string
		if err := json.Unmarshal(raw, &node); err != nil {
			m.log.Error("skipping an unreadable record of a moved sandbox", "sandbox", id, "err", err)
			return nil
		}
		m.mu.Lock()
		m.moved[id] = node
		m.mu.Unlock()
		return nil
	})
}

// forgetMoved drops what this node knew of where sandbox id went.
func (m *Manager) forgetMoved(id string) {
	m.mu.Lock()
	_, ok := m.moved[id]
	delete(m.moved, id)
	m.mu.Unlock()
	if !ok {
		return
	}
	if err := m.cfg.Store.Delete(movedBucket, id); err != nil {
		m.log.Warn("deleting the record of a moved sandbox", "sandbox", id, "err", err)
	}
}

// untilClosed is a context that ends when the manager closes, or when
// its cancel is called.
func (m *Manager) untilClosed() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-m.closed:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// checkArchived asks the archive, once the node starts, about the stubs
// it holds (another node may have taken them in while this one was gone)
// and the sandboxes it knows moved (forgotten once the archive has no
// record of them: removed).
func (m *Manager) checkArchived() {
	defer m.wg.Done()
	ctx, cancel := m.untilClosed()
	defer cancel()
	m.mu.Lock()
	boxes := make([]*box, 0, len(m.boxes))
	for _, b := range m.boxes {
		boxes = append(boxes, b)
	}
	moved := make([]string, 0, len(m.moved))
	for id := range m.moved {
		moved = append(moved, id)
	}
	m.mu.Unlock()
	for _, b := range boxes {
		b.mu.Lock()
		if id := b.rec.ID; b.rec.ArchivedDisk != nil {
			rec, err := m.cfg.Archive.Get(ctx, id)
			switch {
			case err == nil && rec.Disk == nil && rec.Node != m.cfg.Node:
				m.dropStale(b, &errdefs.MovedError{ID: id, Node: rec.Node})
			case errors.Is(err, errdefs.ErrNotFound):
				m.dropStale(b, err)
			case err != nil && ctx.Err() == nil:
				m.log.Warn("checking an archived sandbox's stub against the archive", "sandbox", id, "err", err)
			}
		}
		b.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
	}
	for _, id := range moved {
		if _, err := m.cfg.Archive.Get(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
			m.forgetMoved(id)
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// errNotArchived: the archive has no record of the sandbox.
var errNotArchived = errors.New("not archived")

// restore takes in sandbox id from the archive, as a paused stub, when
// this node has no record of it (its own node is gone); the caller then
// resumes it. A sandbox the archive says another node holds is a
// MovedError. Its timeout goes with it: one that came while it was
// archived removes it now (or, if it pauses on timeout, is spent).
func (m *Manager) restore(ctx context.Context, id string) (*box, error) {
	rec, err := m.cfg.Archive.Get(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, errNotArchived
	}
	if err != nil {
		return nil, err
	}
	if rec.Disk == nil {
		if rec.Node == m.cfg.Node {
			return nil, errdefs.New(errdefs.ErrNotFound, "sandbox %s was restored on this node and is not here any more", id)
		}
		return nil, &errdefs.MovedError{ID: id, Node: rec.Node}
	}
	var r record
	if err := json.Unmarshal(rec.Sandbox, &r); err != nil || r.ID != id {
		return nil, errdefs.New(errdefs.ErrInvalid, "the archived record of %s is corrupt", id)
	}
	r.State, r.Runtime, r.UIDBase, r.Error, r.Node = api.StatePaused, nil, 0, "", m.cfg.Node
	r.ArchivedDisk = rec.Disk
	if len(r.nodeMounts()) > 0 {
		return nil, errdefs.New(errdefs.ErrInvalid, "the archived record of %s mounts volumes", id)
	}
	if err := checkArchivedGroup(&r); err != nil {
		return nil, err
	}
	if r.ExpiresAt != nil && !time.Now().Before(*r.ExpiresAt) {
		if r.OnTimeout != api.TimeoutPause {
			return nil, m.expireArchived(ctx, id, *r.ExpiresAt)
		}
		r.ExpiresAt = nil // its timeout would have paused it: spent
	}
	if _, err := m.cfg.Images.Get(imageRef(r.Sandbox)); err != nil {
		return nil, fmt.Errorf("restoring %s: %w", id, err)
	}
	for _, c := range r.Containers {
		if _, err := m.cfg.Images.Get(imageRef(api.Sandbox{Image: c.Image, ImageID: c.ImageID})); err != nil {
			return nil, fmt.Errorf("restoring %s: container %s: %w", id, c.Name, err)
		}
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
	m.forgetMoved(id) // it came back here
	b.mu.Lock()
	m.armTimer(b)
	b.mu.Unlock()
	m.log.Info("sandbox taken in from the archive", "sandbox", id, "from_node", rec.Node)
	return b, nil
}

// checkArchivedGroup checks the containers of r, an archived record read
// from the store, before this node makes anything of them (their names
// become file and volume names): each member a container of it, each
// shared volume the sandbox's own. It clears what the archiving node's
// runtime kept of each member.
func checkArchivedGroup(r *record) error {
	corrupt := errdefs.New(errdefs.ErrInvalid, "the archived record of %s is corrupt", r.ID)
	if len(r.Members) > 0 && len(r.Containers) != len(r.Members)+1 {
		return corrupt
	}
	for i := range r.Members {
		mr := &r.Members[i]
		if !api.IsContainerName(mr.Name) || r.Containers[i+1].Name != mr.Name {
			return corrupt
		}
		mr.UIDBase, mr.Runtime = 0, nil
	}
	for _, v := range r.SharedVolumes {
		if !api.IsContainerName(v.Name) || v.Volume != r.ID+"-"+v.Name {
			return corrupt
		}
	}
	return nil
}

// expireArchived removes archived sandbox id, whose timeout (at) came
// while no node held it, as its node would have then.
func (m *Manager) expireArchived(ctx context.Context, id string, at time.Time) error {
	m.log.Info("an archived sandbox timed out while no node held it: its archive goes", "sandbox", id, "expired", at)
	if err := m.cfg.Archive.Delete(ctx, id); err != nil {
		m.log.Warn("deleting a timed-out sandbox's archive", "sandbox", id, "err", err)
	}
	return errdefs.New(errdefs.ErrNotFound, "sandbox %s timed out at %s while archived, and is removed", id, at.Format(time.RFC3339))
}

// lookupOrRestore is lookup that, for a sandbox this node has no record
// of, takes it in from the archive (a resume through a gateway that
// placed it here). A sandbox this node knows moved is looked up too: the
// archive is the truth, and the sandbox may have been archived again.
//
// taken says the sandbox was taken in for this call: if the resume
// fails, dropTaken lets it go again.
func (m *Manager) lookupOrRestore(ctx context.Context, id string) (b *box, taken bool, err error) {
	b, err = m.lookup(id)
	if err == nil || m.cfg.Archive == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return b, false, err
	}
	b, err = m.restore(ctx, id)
	if errors.Is(err, errNotArchived) {
		m.forgetMoved(id)
		return nil, false, errdefs.NotFound("sandbox", id)
	}
	return b, err == nil, err
}

// dropTaken forgets stub b (b.mu held), taken in from the archive for a
// resume that failed (another node won the claim, the disk is corrupt):
// the archive keeps the sandbox, for any node to resume.
func (m *Manager) dropTaken(b *box) {
	id := b.rec.ID
	if b.timer != nil {
		b.timer.Stop()
		b.timer = nil
	}
	m.mu.Lock()
	already := b.gone
	b.gone = true
	m.mu.Unlock()
	if already || b.rec.ArchivedDisk == nil {
		return
	}
	if err := m.cfg.Store.Delete(bucket, id); err != nil {
		m.log.Warn("deleting the record of a sandbox taken in from the archive", "sandbox", id, "err", err)
	}
	m.forget(id)
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
	case err == nil && rec.Claim != nil && rec.Claim.Node != m.cfg.Node && time.Since(rec.Claim.At) < archive.ClaimTTL:
		m.log.Info("an archived sandbox removed here is being resumed on another node; its archive stays", "sandbox", id, "node", rec.Claim.Node)
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
	boxes := m.allBoxes()
	for _, b := range boxes {
		if !b.mu.TryLock() {
			continue
		}
		if b.rec.State == api.StatePaused && b.rec.ArchivedDisk == nil && len(b.rec.nodeMounts()) == 0 && b.idleFor(now) >= after &&
			m.cfg.Snapshots != nil && len(m.cfg.Snapshots.List(b.rec.ID)) == 0 {
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
