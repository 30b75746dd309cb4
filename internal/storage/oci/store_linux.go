package oci

import (
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
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/durable"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// Store keeps images and their unpacked layers under one directory. It is
// safe for concurrent use; one process owns a directory at a time.
type Store struct {
	dir      string
	log      *slog.Logger
	lim      Limits
	parallel int
	lock     *durable.Lock

	layerLocks keyedMutex
	unpacks    atomic.Int64 // layers this Store unpacked (tests and metrics)

	mu     sync.Mutex
	closed bool
	images map[string]*record    // by ID's hex
	names  map[string]string     // canonical name -> ID ("sha256:...")
	layers map[string]*layerInfo // complete layers, by diff ID's hex
	// pins counts the imports and pulls in progress that rely on a layer:
	// Remove and Prune leave a pinned layer alone even when no record
	// uses it yet.
	pins map[string]int
}

// record is an image's images/<hex>.json.
type record struct {
	ID          string        `json:"id"`
	Digest      string        `json:"digest"`
	MediaType   string        `json:"media_type,omitempty"`
	RepoDigests []string      `json:"repo_digests,omitempty"`
	Platform    string        `json:"platform,omitempty"`
	Created     time.Time     `json:"created"`
	Stored      time.Time     `json:"stored"`
	Config      recordConfig  `json:"config"`
	Layers      []recordLayer `json:"layers"` // base first, as in the manifest
}

type recordConfig struct {
	Env        []string          `json:"env,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Cmd        []string          `json:"cmd,omitempty"`
	WorkingDir string            `json:"working_dir,omitempty"`
	User       string            `json:"user,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
}

type recordLayer struct {
	DiffID    string `json:"diff_id"`
	Digest    string `json:"digest,omitempty"`
	MediaType string `json:"media_type,omitempty"`
}

var hex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Open opens (creating if needed) the store under dir and recovers it
// from a crash: unpacks that never finished (layers/.tmp-*), deletions
// that never finished (layers/.del-*), spooled imports and half-written
// records are removed; records whose layers are gone are dropped; names
// pointing at no image are dropped. Layers that no record uses are kept
// (a sandbox may still have one mounted): Prune removes them.
func Open(dir string, log *slog.Logger, opts ...Option) (*Store, error) {
	o := options{limits: DefaultLimits, parallel: 3}
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", dir, err)
	}
	// 0700: layers hold setuid-root files, file capabilities and device
	// nodes as the image has them; no one but root may reach them.
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("creating image store: %w", err)
	}
	if err := os.Chmod(abs, 0o700); err != nil {
		return nil, err
	}
	s := &Store{
		dir: abs, log: log, lim: o.limits, parallel: o.parallel,
		images: map[string]*record{}, names: map[string]string{},
		layers: map[string]*layerInfo{}, pins: map[string]int{},
	}
	if s.lock, err = durable.LockDir(abs); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := s.load(); err != nil {
		s.lock.Unlock()
		return nil, err
	}
	return s, nil
}

// Close releases the store's directory. Calls in progress must have
// returned.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.lock.Unlock()
}

func (s *Store) load() error {
	for _, sub := range []string{"layers", "blobs/sha256", "images", "tmp"} {
		if err := os.MkdirAll(filepath.Join(s.dir, sub), 0o700); err != nil {
			return err
		}
	}
	// Unpacking needs openat2 (Linux 5.6): find out now, not mid-pull.
	if fd, err := openBeneath(unix.AT_FDCWD, s.layersDir(), unix.O_PATH); err != nil {
		if err == unix.ENOSYS {
			return fmt.Errorf("%w: the kernel lacks openat2 (Linux 5.6 or later is needed)", errdefs.ErrUnavailable)
		}
	} else {
		unix.Close(fd)
	}
	if err := s.sweep(filepath.Join(s.dir, "tmp"), func(string) bool { return true }); err != nil {
		return err
	}
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		p := filepath.Join(s.layersDir(), n)
		switch {
		case strings.HasPrefix(n, tmpPrefix), strings.HasPrefix(n, delPrefix):
			s.log.Info("removing unfinished layer", "dir", n)
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("removing %s: %w", p, err)
			}
		case hex64.MatchString(n):
			info, err := readLayerInfo(p)
			if err != nil || info.DiffID != "sha256:"+n {
				// Cannot happen short of tampering: layers are renamed
				// into place with their info written.
				s.log.Warn("removing layer without valid metadata", "dir", n, "err", err)
				if err := os.RemoveAll(p); err != nil {
					return err
				}
				continue
			}
			s.layers[n] = info
		}
	}
	if err := s.sweep(filepath.Join(s.dir, "images"), func(n string) bool { return strings.HasPrefix(n, tmpPrefix) }); err != nil {
		return err
	}
	if err := s.sweep(filepath.Join(s.dir, "blobs/sha256"), func(n string) bool { return strings.HasPrefix(n, tmpPrefix) }); err != nil {
		return err
	}
	entries, err = os.ReadDir(filepath.Join(s.dir, "images"))
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := strings.TrimSuffix(e.Name(), ".json")
		if !hex64.MatchString(n) || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(s.dir, "images", e.Name())
		var rec record
		data, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err == nil && rec.ID != "sha256:"+n {
			err = fmt.Errorf("record names image %s", rec.ID)
		}
		if err == nil {
			for _, l := range rec.Layers {
				if s.layers[strings.TrimPrefix(l.DiffID, "sha256:")] == nil {
					err = fmt.Errorf("layer %s is missing", short(l.DiffID))
					break
				}
			}
		}
		if err != nil {
			s.log.Warn("dropping unusable image record", "id", short("sha256:"+n), "err", err)
			if err := os.Remove(p); err != nil {
				return err
			}
			continue
		}
		s.images[n] = &rec
	}
	data, err := os.ReadFile(filepath.Join(s.dir, "names.json"))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if len(data) > 0 {
		if err := json.Unmarshal(data, &s.names); err != nil {
			return fmt.Errorf("reading names.json: %w", err)
		}
	}
	dropped := false
	for n, id := range s.names {
		if s.images[strings.TrimPrefix(id, "sha256:")] == nil {
			delete(s.names, n)
			dropped = true
		}
	}
	if dropped {
		return s.saveNames()
	}
	s.log.Info("image store open", "dir", s.dir, "images", len(s.images), "layers", len(s.layers))
	return nil
}

// sweep removes the entries of dir that match.
func (s *Store) sweep(dir string, match func(string) bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if match(e.Name()) {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func readLayerInfo(dir string) (*layerInfo, error) {
	data, err := os.ReadFile(filepath.Join(dir, layerInfoName))
	if err != nil {
		return nil, err
	}
	var info layerInfo
	if err := json.Unmarshal(data, &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// saveNames writes names.json; s.mu is held.
func (s *Store) saveNames() error {
	data, err := json.MarshalIndent(s.names, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(filepath.Join(s.dir, "names.json"), data, 0o600)
}

// saveRecord writes an image's record; s.mu is held.
func (s *Store) saveRecord(rec *record) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return durable.WriteFile(filepath.Join(s.dir, "images", strings.TrimPrefix(rec.ID, "sha256:")+".json"), data, 0o600)
}

// Get returns the image that nameOrDigest names: a name ("app" means
// "app:latest"), the image's ID or manifest digest ("sha256:<hex>"), a
// pinned reference it was pulled as ("repo@sha256:<hex>"), or at least 12
// hex digits of its ID. An unknown image is errdefs.ErrNotFound.
func (s *Store) Get(nameOrDigest string) (*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hexID, byName, err := s.resolve(nameOrDigest)
	if err != nil {
		return nil, err
	}
	return s.image(s.images[hexID], byName), nil
}

// List returns every image, sorted by name (unnamed images last, by ID).
func (s *Store) List() ([]*Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Image, 0, len(s.images))
	for _, rec := range s.images {
		out = append(out, s.image(rec, ""))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Name == "") != (b.Name == "") {
			return a.Name != ""
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.ID < b.ID
	})
	return out, nil
}

// resolve finds an image; it returns the ID's hex and, when found by
// name, the canonical name. s.mu is held.
func (s *Store) resolve(q string) (hexID, byName string, err error) {
	if id, ok := s.names[q]; ok {
		return strings.TrimPrefix(id, "sha256:"), q, nil
	}
	if strings.HasPrefix(q, "sha256:") {
		h := strings.TrimPrefix(q, "sha256:")
		if s.images[h] != nil {
			return h, "", nil
		}
		for k, rec := range s.images {
			if rec.Digest == q {
				return k, "", nil
			}
		}
		return "", "", errdefs.NotFound("image", q)
	}
	for k, rec := range s.images {
		for _, rd := range rec.RepoDigests {
			if rd == q {
				return k, "", nil
			}
		}
	}
	if n, err := normalizeName(q); err == nil {
		if id, ok := s.names[n]; ok {
			return strings.TrimPrefix(id, "sha256:"), n, nil
		}
	}
	if len(q) >= 12 && len(q) <= 64 && strings.Trim(q, "0123456789abcdef") == "" {
		var found []string
		for k := range s.images {
			if strings.HasPrefix(k, q) {
				found = append(found, k)
			}
		}
		if len(found) == 1 {
			return found[0], "", nil
		}
		if len(found) > 1 {
			return "", "", errdefs.Invalid("image", "%q matches %d images", q, len(found))
		}
	}
	return "", "", errdefs.NotFound("image", q)
}

// namesOf returns the names pointing at an image, sorted; s.mu is held.
func (s *Store) namesOf(id string) []string {
	var out []string
	for n, v := range s.names {
		if v == id {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// image builds the public view of a record; s.mu is held.
func (s *Store) image(rec *record, asked string) *Image {
	img := &Image{
		Names:       s.namesOf(rec.ID),
		ID:          rec.ID,
		Digest:      rec.Digest,
		RepoDigests: append([]string(nil), rec.RepoDigests...),
		Env:         append([]string(nil), rec.Config.Env...),
		Workdir:     rec.Config.WorkingDir,
		User:        rec.Config.User,
		Entrypoint:  append([]string(nil), rec.Config.Entrypoint...),
		Cmd:         append([]string(nil), rec.Config.Cmd...),
		Platform:    rec.Platform,
		Created:     rec.Created,
		Stored:      rec.Stored,
	}
	if len(rec.Config.Labels) > 0 {
		img.Labels = make(map[string]string, len(rec.Config.Labels))
		for k, v := range rec.Config.Labels {
			img.Labels[k] = v
		}
	}
	img.Name = asked
	if img.Name == "" && len(img.Names) > 0 {
		img.Name = img.Names[0]
	}
	img.Layers = s.stack(rec)
	for _, l := range rec.Layers {
		if info := s.layers[strings.TrimPrefix(l.DiffID, "sha256:")]; info != nil {
			img.Size += info.Size
		}
	}
	return img
}

// stack returns the directories overlayfs mounts for an image, top-most
// first. A layer that appears twice is mounted once, at its top-most place
// (the lower copy can show nothing the upper one does not; overlayfs
// refuses overlapping lower dirs). A layer with an opaque root hides
// everything beneath it, so the stack ends there. s.mu is held.
func (s *Store) stack(rec *record) []string {
	var out []string
	seen := map[string]bool{}
	for i := len(rec.Layers) - 1; i >= 0; i-- {
		h := strings.TrimPrefix(rec.Layers[i].DiffID, "sha256:")
		if seen[h] {
			continue
		}
		seen[h] = true
		out = append(out, s.layerRoot(h))
		if info := s.layers[h]; info != nil && info.OpaqueRoot {
			break
		}
	}
	return out
}

// usedByRecord reports whether any image other than except uses the
// layer; s.mu is held.
func (s *Store) usedByRecord(layerHex, except string) bool {
	for k, rec := range s.images {
		if k == except {
			continue
		}
		for _, l := range rec.Layers {
			if strings.TrimPrefix(l.DiffID, "sha256:") == layerHex {
				return true
			}
		}
	}
	return false
}

// Remove removes what nameOrDigest names (see Get). Given a name of an
// image that has others, it removes only that name, as `docker rmi` does.
// Otherwise it removes the image's record and names, and the layers no
// other image uses: each is first offered to inUse (its directory, as in
// Image.Layers), which returns who has it mounted; if anyone does, nothing
// is removed and the error (errdefs.ErrConflict) names them. inUse runs
// with the store locked and must not call back into it; nil means nothing
// is in use. The caller keeps new mounts of the image's layers from
// starting while Remove runs (or they may find a layer gone).
func (s *Store) Remove(nameOrDigest string, inUse func(layer string) []string) error {
	s.mu.Lock()
	hexID, byName, err := s.resolve(nameOrDigest)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	rec := s.images[hexID]
	names := s.namesOf(rec.ID)
	if byName != "" && len(names) > 1 {
		delete(s.names, byName)
		err := s.saveNames()
		s.mu.Unlock()
		if err == nil {
			s.log.Info("image name removed", "name", byName, "id", short(rec.ID))
		}
		return err
	}
	var own []string
	seen := map[string]bool{}
	for _, l := range rec.Layers {
		h := strings.TrimPrefix(l.DiffID, "sha256:")
		if !seen[h] && !s.usedByRecord(h, hexID) {
			own = append(own, h)
		}
		seen[h] = true
	}
	var busy []string
	if inUse != nil {
		for _, h := range own {
			if users := inUse(s.layerRoot(h)); len(users) > 0 {
				busy = append(busy, fmt.Sprintf("layer %s by %s", short("sha256:"+h), strings.Join(users, ", ")))
			}
		}
	}
	if len(busy) > 0 {
		s.mu.Unlock()
		return errdefs.Conflict("image %s is in use: %s", display(rec, names), strings.Join(busy, "; "))
	}
	for _, n := range names {
		delete(s.names, n)
	}
	if err := s.saveNames(); err != nil {
		s.mu.Unlock()
		return err
	}
	if err := os.Remove(filepath.Join(s.dir, "images", hexID+".json")); err != nil && !os.IsNotExist(err) {
		s.mu.Unlock()
		return err
	}
	delete(s.images, hexID)
	for _, d := range []string{rec.ID, rec.Digest} {
		os.Remove(filepath.Join(s.dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
	}
	trash := s.detachLayers(own)
	s.mu.Unlock()
	s.log.Info("image removed", "image", display(rec, names), "layers_removed", len(trash))
	return s.emptyTrash(trash)
}

func display(rec *record, names []string) string {
	if len(names) > 0 {
		return names[0]
	}
	return short(rec.ID)
}

// detachLayers takes unpinned layers out of the index and renames their
// directories aside (one rename each, so a crash leaves each either in
// place or in layers/.del-*, which Open sweeps). s.mu is held.
func (s *Store) detachLayers(hexes []string) []string {
	var trash []string
	for _, h := range hexes {
		if s.pins[h] > 0 || s.layers[h] == nil {
			continue
		}
		delete(s.layers, h)
		dst := filepath.Join(s.layersDir(), fmt.Sprintf("%s%s-%d", delPrefix, h, time.Now().UnixNano()))
		if err := os.Rename(s.layerDir(h), dst); err != nil {
			s.log.Error("removing layer", "diff_id", short("sha256:"+h), "err", err)
			continue
		}
		trash = append(trash, dst)
	}
	return trash
}

func (s *Store) emptyTrash(trash []string) error {
	var errs []error
	for _, d := range trash {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Prune removes the layers no image uses, no import or pull in progress
// relies on and inUse (as for Remove) reports unused: what a crash between
// unpacking and recording, or a layer kept by a mount, leaves behind. It
// returns how many layers it removed and their unpacked size.
func (s *Store) Prune(inUse func(layer string) []string) (int, int64, error) {
	s.mu.Lock()
	var victims []string
	var size int64
	for h, info := range s.layers {
		if s.pins[h] > 0 || s.usedByRecord(h, "") {
			continue
		}
		if inUse != nil && len(inUse(s.layerRoot(h))) > 0 {
			continue
		}
		victims = append(victims, h)
		size += info.Size
	}
	trash := s.detachLayers(victims)
	s.mu.Unlock()
	return len(trash), size, s.emptyTrash(trash)
}
