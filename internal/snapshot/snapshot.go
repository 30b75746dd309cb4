// Package snapshot owns captured sandbox filesystems. A snapshot is an
// image file: for a whole sandbox, a copy of its disk (the overlay's
// writable layer on ext4) taken while its processes were frozen; for a
// directory snapshot, a volume-format filesystem (files under data/) holding
// the merged content of one directory. On a reflink-capable substrate both
// copies share blocks with their source, so a capture costs metadata, not
// data. Each snapshot is one layer over its base image, so there are no
// chains to flatten: a sandbox made from a snapshot writes to its own copy,
// and a snapshot of that sandbox is again one layer.
//
// A memory snapshot also holds the checkpoint of the sandbox's processes,
// written while they were stopped for the capture, so that the two match:
// sandboxes made from it restore the checkpoint over a copy of the disk.
//
// Layout under Config.Dir:
//
//	<id>/disk.img         the captured filesystem
//	<id>/checkpoint/      a memory snapshot's checkpoint (its runtime's files)
//	<id>/checkpoint.sums  their sizes and checksums, checked before a restore
//
// A snapshot exists once its record is written; a directory without one
// was half made and is removed by Open. Directory snapshots mounted into
// sandboxes are attached read-only through Config.Mounts, which also keeps
// the count of their users: a snapshot in use cannot be removed.
package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/store"
)

const (
	bucket         = "snapshots"
	imageName      = "disk.img"
	checkpointName = "checkpoint"
	// DataDir is where a directory snapshot's files sit in its image.
	DataDir = "data"
	// Prefix starts every snapshot id.
	Prefix = "snap-"
)

var idPattern = regexp.MustCompile(`^snap-[a-z0-9]{12}$`)

// IsID reports whether s looks like a snapshot id (not whether it exists).
func IsID(s string) bool { return idPattern.MatchString(s) }

// newID mints a snapshot id: Prefix and a sandbox-style id, which starts
// with the node's tag in a cluster, so that a gateway routes calls for
// the snapshot to its node.
func newID() string { return Prefix + runtime.NewID() }

// Config configures a Store.
type Config struct {
	// Dir holds the snapshots' images; it must be on the same filesystem
	// as the sandboxes' disks for captures to share their blocks.
	Dir   string
	Store *store.Store
	// Mounts attaches directory snapshots for sandboxes to mount.
	Mounts *disk.Pool
	// Removed, if set, is told the image path of each snapshot removed
	// or capture aborted (the sandboxes' disk pool drops its ready clone
	// and its seed of it).
	Removed func(imagePath string)
	Logger  *slog.Logger
}

// Store manages snapshots.
type Store struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	snaps map[string]*api.Snapshot
	// users maps a snapshot to what holds it: "sandbox:<id>",
	// "template:<name>".
	users map[string]map[string]bool
}

// Open loads the recorded snapshots and removes half-made ones.
func Open(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	s := &Store{cfg: cfg, log: cfg.Logger, snaps: map[string]*api.Snapshot{}, users: map[string]map[string]bool{}}
	err := cfg.Store.Each(bucket, func(key string, raw json.RawMessage) error {
		var v api.Snapshot
		if err := json.Unmarshal(raw, &v); err != nil {
			s.log.Warn("skipping an unreadable snapshot record", "snapshot", key, "err", err)
			return nil
		}
		if _, err := os.Stat(s.imagePath(v.ID)); err != nil {
			s.log.Warn("snapshot image is missing; dropping its record", "snapshot", v.ID, "err", err)
			cfg.Store.Delete(bucket, v.ID)
			return nil
		}
		if v.Memory != nil {
			if _, err := os.Stat(s.checkpointPath(v.ID)); err != nil {
				s.log.Warn("memory snapshot's checkpoint is missing; dropping its record", "snapshot", v.ID, "err", err)
				cfg.Store.Delete(bucket, v.ID)
				return nil
			}
		}
		v.UsedBy = nil
		s.snaps[v.ID] = &v
		return nil
	})
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if s.snaps[e.Name()] == nil {
			s.log.Info("removing a half-made snapshot", "snapshot", e.Name())
			os.RemoveAll(filepath.Join(cfg.Dir, e.Name()))
		}
	}
	// Mounted directory snapshots without a record go; the others are
	// mounted again as their users are restored.
	if cfg.Mounts != nil {
		ids, err := cfg.Mounts.List()
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if s.snaps[id] == nil {
				cfg.Mounts.Remove(context.Background(), id)
			}
		}
	}
	return s, nil
}

func (s *Store) imagePath(id string) string { return filepath.Join(s.cfg.Dir, id, imageName) }

// containerImage is the image of container name (not the first) of a
// snapshot of a sandbox of several containers, beside the first's.
func containerImage(dir, name string) string {
	return filepath.Join(dir, "container-"+name+".img")
}

// ContainerPath is where Pending writes the image of container name (not
// the first; api.IsContainerName holds) of a sandbox of several.
func (p *Pending) ContainerPath(name string) string {
	return containerImage(filepath.Dir(p.Path), name)
}

// ContainerImagePath returns the image of container name (not the first)
// of a snapshot of a sandbox of several containers.
func (s *Store) ContainerImagePath(id, name string) (string, error) {
	snap, err := s.Get(id)
	if err != nil {
		return "", err
	}
	for _, c := range snap.Containers[min(1, len(snap.Containers)):] {
		if c.Name == name {
			return containerImage(filepath.Join(s.cfg.Dir, id), name), nil
		}
	}
	return "", errdefs.NotFound("container of snapshot "+id, name)
}

// sharedImage is the image of shared volume name of a snapshot of a
// sandbox of several containers, beside its containers'.
func sharedImage(dir, name string) string {
	return filepath.Join(dir, "shared-"+name+".img")
}

// SharedPath is where Pending writes the image of shared volume name
// (api.IsContainerName holds) of a sandbox of several containers.
func (p *Pending) SharedPath(name string) string {
	return sharedImage(filepath.Dir(p.Path), name)
}

// SharedImagePath returns the image of shared volume name of a snapshot
// of a sandbox of several containers.
func (s *Store) SharedImagePath(id, name string) (string, error) {
	snap, err := s.Get(id)
	if err != nil {
		return "", err
	}
	for _, v := range snap.SharedVolumes {
		if v.Name == name {
			return sharedImage(filepath.Join(s.cfg.Dir, id), name), nil
		}
	}
	return "", errdefs.NotFound("shared volume of snapshot "+id, name)
}

// Pending is a snapshot being made: its image is written at Path, then

func (s *Store) checkpointPath(id string) string { return filepath.Join(s.cfg.Dir, id, checkpointName) }

// Pending is a snapshot being made: its image is written at Path (and a
// memory snapshot's checkpoint in the new directory Checkpoint), then
// Commit records it or Abort removes it.
type Pending struct {
	s          *Store
	ID         string
	Path       string
	Checkpoint string
}

// Begin starts a snapshot.
func (s *Store) Begin() (*Pending, error) {
	id := newID()
	if err := os.Mkdir(filepath.Join(s.cfg.Dir, id), 0o700); err != nil {
		return nil, fmt.Errorf("making snapshot directory: %w", err)
	}
	return &Pending{s: s, ID: id, Path: s.imagePath(id), Checkpoint: s.checkpointPath(id)}, nil
}

// Commit records the snapshot described by snap (its ID is set here);
// a memory snapshot's checkpoint is summed first (checkpoint.go).
func (p *Pending) Commit(snap api.Snapshot) (api.Snapshot, error) {
	snap.ID = p.ID
	snap.UsedBy = nil
	if snap.Memory != nil {
		if err := p.s.sealCheckpoint(p.ID); err != nil {
			p.Abort()
			return api.Snapshot{}, err
		}
	}
	if err := p.s.cfg.Store.Put(bucket, snap.ID, snap); err != nil {
		p.Abort()
		return api.Snapshot{}, fmt.Errorf("recording snapshot: %w", err)
	}
	p.s.mu.Lock()
	p.s.snaps[snap.ID] = &snap
	p.s.mu.Unlock()
	return snap, nil
}

// Abort removes what the snapshot wrote (a fork's capture, or a failed
// snapshot), and tells Removed of its image as Remove does.
func (p *Pending) Abort() {
	if err := os.RemoveAll(filepath.Dir(p.Path)); err != nil {
		p.s.log.Warn("removing a failed snapshot", "snapshot", p.ID, "err", err)
	}
	if p.s.cfg.Removed != nil {
		p.s.cfg.Removed(p.Path)
	}
}

func validID(id string) error {
	if !IsID(id) {
		return errdefs.Invalid("id", "%q is not a snapshot id", trunc(id))
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Get describes a snapshot.
func (s *Store) Get(id string) (api.Snapshot, error) {
	if err := validID(id); err != nil {
		return api.Snapshot{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.snaps[id]
	if v == nil {
		return api.Snapshot{}, errdefs.NotFound("snapshot", id)
	}
	out := *v
	out.UsedBy = s.usersLocked(id)
	return out, nil
}

// List describes every snapshot, oldest first, or those of one sandbox.
func (s *Store) List(sandbox string) []api.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]api.Snapshot, 0, len(s.snaps))
	for id, v := range s.snaps {
		if sandbox != "" && v.Sandbox != sandbox {
			continue
		}
		c := *v
		c.UsedBy = s.usersLocked(id)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

func (s *Store) usersLocked(id string) []string {
	var out []string
	for u := range s.users[id] {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// ImagePath returns the image of a snapshot, for making a sandbox or a
// volume from it.
func (s *Store) ImagePath(id string) (string, error) {
	if _, err := s.Get(id); err != nil {
		return "", err
	}
	return s.imagePath(id), nil
}

// CheckpointPath returns the checkpoint of memory snapshot id, for
// making a sandbox from it, once its files are found intact.
func (s *Store) CheckpointPath(id string) (string, error) {
	snap, err := s.Get(id)
	if err != nil {
		return "", err
	}
	if snap.Memory == nil {
		return "", errdefs.Invalid("snapshot", "%s holds no memory checkpoint", id)
	}
	if err := s.checkCheckpoint(id); err != nil {
		return "", err
	}
	return s.checkpointPath(id), nil
}

// Hold records that user (e.g. "template:web") needs snapshot id.
func (s *Store) Hold(id, user string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snaps[id] == nil {
		return errdefs.NotFound("snapshot", id)
	}
	if s.users[id] == nil {
		s.users[id] = map[string]bool{}
	}
	s.users[id][user] = true
	return nil
}

// Drop forgets that user needs snapshot id.
func (s *Store) Drop(id, user string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.users[id], user)
	if len(s.users[id]) == 0 {
		delete(s.users, id)
	}
}

// Mount attaches directory snapshot id read-only for a sandbox and returns
// the host directory of its files; the sandbox holds it until Unmount.
func (s *Store) Mount(ctx context.Context, id, sandbox string) (string, error) {
	snap, err := s.Get(id)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return "", errdefs.Invalid("volumes", "unknown snapshot %q", id)
		}
		return "", err
	}
	if snap.Path == "" {
		return "", errdefs.Invalid("volumes", "snapshot %s is of a whole sandbox; only a directory snapshot (taken with a path) can be mounted", id)
	}
	if err := s.Hold(id, "sandbox:"+sandbox); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.cfg.Mounts.Open(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		v, err = s.cfg.Mounts.AcquireFrom(ctx, id, s.imagePath(id), 0, 0)
	}
	if err != nil {
		delete(s.users[id], "sandbox:"+sandbox)
		return "", fmt.Errorf("attaching snapshot %s: %w", id, err)
	}
	return filepath.Join(v.Path, DataDir), nil
}

// Unmount releases a sandbox's hold on a directory snapshot, detaching it
// when nobody mounts it any more.
func (s *Store) Unmount(id, sandbox string) {
	s.Drop(id, "sandbox:"+sandbox)
	s.mu.Lock()
	defer s.mu.Unlock()
	for u := range s.users[id] {
		if strings.HasPrefix(u, "sandbox:") {
			return
		}
	}
	if err := s.cfg.Mounts.Remove(context.Background(), id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("detaching a directory snapshot", "snapshot", id, "err", err)
	}
}

// Remove deletes a snapshot that nothing holds.
func (s *Store) Remove(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	s.mu.Lock()
	if s.snaps[id] == nil {
		s.mu.Unlock()
		return errdefs.NotFound("snapshot", id)
	}
	if users := s.usersLocked(id); len(users) > 0 {
		s.mu.Unlock()
		return errdefs.Conflict("snapshot %s is in use by %s", id, strings.Join(users, ", "))
	}
	delete(s.snaps, id)
	s.mu.Unlock()
	if err := s.cfg.Store.Delete(bucket, id); err != nil {
		return err
	}
	if err := os.RemoveAll(filepath.Join(s.cfg.Dir, id)); err != nil {
		return fmt.Errorf("removing snapshot %s: %w", id, err)
	}
	if s.cfg.Removed != nil { // after: a clone being made now is not kept
		s.cfg.Removed(s.imagePath(id))
	}
	s.log.Info("snapshot removed", "snapshot", id)
	return nil
}

// Close releases the mounts pool (mounted snapshots stay attached).
func (s *Store) Close() error {
	if s.cfg.Mounts == nil {
		return nil
	}
	return s.cfg.Mounts.Close()
}
