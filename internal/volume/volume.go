// Package volume owns named volumes: size-capped filesystems made on their
// own, mounted read-write or read-only into any number of sandboxes, and
// kept until they are removed. Each is a disk.Pool volume (an ext4 image on
// a loop device); its files live in the data directory at its root, owned
// by canonical ids (root is 0), and are attached to each sandbox through an
// idmapped mount of that sandbox's user namespace, so every sandbox sees
// them as its own whatever its host uid range.
//
// Which sandboxes use a volume is not stored here: the sandbox manager
// rebuilds it from its records with Use and keeps it current, and Remove
// refuses a volume in use.
package volume

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
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/store"
)

const (
	bucket  = "volumes"
	dataDir = "data"
	minSize = disk.MinSize
	maxSize = disk.MaxSize
)

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// ValidName checks a volume name.
func ValidName(name string) error {
	if !namePattern.MatchString(name) {
		return errdefs.Invalid("name", "%q is not a volume name (1 to 64 characters of [a-z0-9-], starting with a letter or digit)", trunc(name))
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Config configures a Store.
type Config struct {
	// Disks holds the volumes' filesystems; the store owns it.
	Disks *disk.Pool
	Store *store.Store
	// DefaultSize is the size of a volume created without one.
	DefaultSize int64
	Logger      *slog.Logger
}

// Store manages named volumes.
type Store struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex
	vols map[string]*api.Volume
	// users maps a volume to the sandboxes that mount it.
	users map[string]map[string]bool
	// busy marks volumes being created or removed.
	busy map[string]bool
}

// Open loads the recorded volumes and mounts their filesystems.
func Open(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{cfg: cfg, log: cfg.Logger, vols: map[string]*api.Volume{}, users: map[string]map[string]bool{}, busy: map[string]bool{}}
	err := cfg.Store.Each(bucket, func(key string, raw json.RawMessage) error {
		var v api.Volume
		if err := json.Unmarshal(raw, &v); err != nil {
			s.log.Warn("skipping an unreadable volume record", "volume", key, "err", err)
			return nil
		}
		v.UsedBy = nil
		s.vols[v.Name] = &v
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Filesystems without a record were half made or half removed.
	ids, err := cfg.Disks.List()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		if _, ok := s.vols[id]; ok {
			continue
		}
		s.log.Info("removing a volume filesystem with no record", "volume", id)
		if err := cfg.Disks.Remove(context.Background(), id); err != nil {
			s.log.Warn("removing a leftover volume filesystem", "volume", id, "err", err)
		}
	}
	for name := range s.vols {
		if _, err := cfg.Disks.Open(name); err != nil {
			s.log.Warn("volume filesystem is missing; its record stays so that it can be removed", "volume", name, "err", err)
		}
	}
	return s, nil
}

// Create makes a volume, empty or filled from a directory snapshot's image
// (fromImage, a file the caller keeps).
func (s *Store) Create(ctx context.Context, req api.VolumeRequest, fromImage string) (api.Volume, error) {
	if err := ValidName(req.Name); err != nil {
		return api.Volume{}, err
	}
	size := req.SizeBytes
	if size == 0 {
		size = s.cfg.DefaultSize
	}
	if size < minSize || size > maxSize {
		return api.Volume{}, errdefs.Invalid("size_bytes", "%d is outside %d MiB..%d TiB", req.SizeBytes, minSize>>20, maxSize>>40)
	}
	s.mu.Lock()
	if s.vols[req.Name] != nil || s.busy[req.Name] {
		s.mu.Unlock()
		return api.Volume{}, errdefs.Conflict("volume %s already exists", req.Name)
	}
	s.busy[req.Name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, req.Name)
		s.mu.Unlock()
	}()

	var dv *disk.Volume
	var err error
	if fromImage != "" {
		dv, err = s.cfg.Disks.AcquireFrom(ctx, req.Name, fromImage, 0, 0)
	} else {
		dv, err = s.cfg.Disks.Acquire(ctx, req.Name, size, 0, 0)
	}
	if err != nil {
		return api.Volume{}, fmt.Errorf("making volume %s: %w", req.Name, err)
	}
	undo := func() {
		if err := s.cfg.Disks.Remove(context.Background(), req.Name); err != nil {
			s.log.Warn("removing a half-made volume", "volume", req.Name, "err", err)
		}
	}
	data := filepath.Join(dv.Path, dataDir)
	if err := os.Mkdir(data, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		undo()
		return api.Volume{}, err
	}
	if err := os.Lchown(data, 0, 0); err != nil {
		undo()
		return api.Volume{}, err
	}
	v := &api.Volume{Name: req.Name, SizeBytes: dv.Size, Labels: req.Labels, CreatedAt: time.Now().UTC()}
	if err := s.cfg.Store.Put(bucket, v.Name, v); err != nil {
		undo()
		return api.Volume{}, fmt.Errorf("recording volume: %w", err)
	}
	s.mu.Lock()
	s.vols[v.Name] = v
	s.mu.Unlock()
	s.log.Info("volume created", "volume", v.Name, "size", v.SizeBytes)
	return s.Get(v.Name)
}

// Get describes a volume.
func (s *Store) Get(name string) (api.Volume, error) {
	if err := ValidName(name); err != nil {
		return api.Volume{}, err
	}
	s.mu.Lock()
	v := s.vols[name]
	if v == nil {
		s.mu.Unlock()
		return api.Volume{}, errdefs.NotFound("volume", name)
	}
	out := *v
	out.UsedBy = s.usersLocked(name)
	s.mu.Unlock()
	if dv, err := s.cfg.Disks.Open(name); err == nil {
		if used, _, err := dv.Usage(); err == nil {
			out.UsedBytes = used
		}
	}
	return out, nil
}

// List describes every volume, by name.
func (s *Store) List() []api.Volume {
	s.mu.Lock()
	names := make([]string, 0, len(s.vols))
	for n := range s.vols {
		names = append(names, n)
	}
	s.mu.Unlock()
	sort.Strings(names)
	out := make([]api.Volume, 0, len(names))
	for _, n := range names {
		if v, err := s.Get(n); err == nil {
			out = append(out, v)
		}
	}
	return out
}

func (s *Store) usersLocked(name string) []string {
	var out []string
	for id := range s.users[name] {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Remove deletes a volume and its files. A volume that a sandbox mounts is
// refused, naming the sandboxes.
func (s *Store) Remove(ctx context.Context, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	s.mu.Lock()
	if s.vols[name] == nil {
		s.mu.Unlock()
		return errdefs.NotFound("volume", name)
	}
	if users := s.usersLocked(name); len(users) > 0 {
		s.mu.Unlock()
		return errdefs.Conflict("volume %s is mounted by sandboxes %v; remove them first", name, users)
	}
	if s.busy[name] {
		s.mu.Unlock()
		return errdefs.Conflict("volume %s is busy", name)
	}
	s.busy[name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.busy, name)
		s.mu.Unlock()
	}()
	if err := s.cfg.Disks.Remove(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("removing volume %s: %w", name, err)
	}
	if err := s.cfg.Store.Delete(bucket, name); err != nil {
		return err
	}
	s.mu.Lock()
	delete(s.vols, name)
	s.mu.Unlock()
	s.log.Info("volume removed", "volume", name)
	return nil
}

// Use records that sandbox mounts the named volumes and returns, for each,
// the host directory to mount. It fails, recording nothing, if one is
// unknown or being removed.
func (s *Store) Use(sandbox string, names []string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		if s.vols[n] == nil {
			return nil, errdefs.Invalid("volumes", "unknown volume %q", n)
		}
		if s.busy[n] {
			return nil, errdefs.Conflict("volume %s is being removed", n)
		}
	}
	paths := make([]string, len(names))
	for i, n := range names {
		dv, err := s.cfg.Disks.Open(n)
		if err != nil {
			return nil, fmt.Errorf("opening volume %s: %w", n, err)
		}
		paths[i] = filepath.Join(dv.Path, dataDir)
	}
	for _, n := range names {
		if s.users[n] == nil {
			s.users[n] = map[string]bool{}
		}
		s.users[n][sandbox] = true
	}
	return paths, nil
}

// Release forgets that sandbox mounts the named volumes.
func (s *Store) Release(sandbox string, names []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range names {
		delete(s.users[n], sandbox)
		if len(s.users[n]) == 0 {
			delete(s.users, n)
		}
	}
}

// Rename moves sandbox old's uses to sandbox new (a sandbox takes its id
// only once the runtime has made it).
func (s *Store) Rename(old, new string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.users {
		if u[old] {
			delete(u, old)
			u[new] = true
		}
	}
}

// ImagePath is the backing file of a volume, for copying it.
func (s *Store) ImagePath(name string) (string, error) {
	s.mu.Lock()
	ok := s.vols[name] != nil
	s.mu.Unlock()
	if !ok {
		return "", errdefs.NotFound("volume", name)
	}
	return s.cfg.Disks.ImagePath(name)
}

// Capture copies volume name's filesystem into the new file dst,
// consistently: pause, when not nil, freezes its writers around the copy.
func (s *Store) Capture(ctx context.Context, name, dst string, pause func() (func(), error)) error {
	s.mu.Lock()
	ok := s.vols[name] != nil
	s.mu.Unlock()
	if !ok {
		return errdefs.NotFound("volume", name)
	}
	if _, err := s.cfg.Disks.Snapshot(ctx, name, dst, pause); err != nil {
		return fmt.Errorf("copying volume %s: %w", name, err)
	}
	return nil
}

// Close releases the store's disk pool (volumes stay mounted).
func (s *Store) Close() error { return s.cfg.Disks.Close() }
