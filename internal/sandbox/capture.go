package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/snapshot"
)

// maxForks bounds one fork request.
const maxForks = 64

// Create captures sandbox id's filesystem, or one directory of it, without
// stopping it: its processes are frozen only while the disk is copied
// (a reflink: metadata, not data, where the filesystem allows).
func (s Snapshots) Create(ctx context.Context, id string, req api.SnapshotRequest) (api.Snapshot, error) {
	return s.CreateIn(ctx, id, "", req)
}

// CreateIn is Create addressing container name of a sandbox of several
// ("" or its first's name: the first): a directory snapshot holds that
// container's directory. A snapshot of a whole group captures every
// container, and names none.
func (s Snapshots) CreateIn(ctx context.Context, id, container string, req api.SnapshotRequest) (api.Snapshot, error) {
	m := s.m
	if m.cfg.Snapshots == nil {
		return api.Snapshot{}, errdefs.New(errdefs.ErrUnavailable, "snapshots are not configured")
	}
	if err := ValidateLabels(req.Labels); err != nil {
		return api.Snapshot{}, err
	}
	if req.Path != "" {
		if req.Memory {
			return api.Snapshot{}, errdefs.Invalid("memory", "a directory snapshot holds files only; leave path empty for a memory snapshot")
		}
		if err := reqcheck.Path("path", req.Path); err != nil {
			return api.Snapshot{}, err
		}
		req.Path = strings.TrimSuffix(req.Path, "/")
		if req.Path == "" {
			return api.Snapshot{}, errdefs.Invalid("path", "a directory snapshot needs a directory below /; leave path empty to capture the whole sandbox")
		}
	}
	b, err := m.lookup(id)
	if err != nil {
		return api.Snapshot{}, err
	}
	ci, err := b.containerIndex(container)
	if err != nil {
		return api.Snapshot{}, err
	}
	if container != "" && b.group() && req.Path == "" {
		return api.Snapshot{}, errdefs.Invalid(api.ContainerParam, "a snapshot of sandbox %s captures every container: name one only for a directory snapshot (path)", id)
	}
	p, err := m.cfg.Snapshots.Begin()
	if err != nil {
		return api.Snapshot{}, err
	}
	snap, err := m.snapshotOf(ctx, b, p, req, ci)
	if err != nil {
		p.Abort()
		if errdefs.IsNoSpace(err) {
			m.log.Warn("snapshot does not fit", "sandbox", id, "err", err)
			why := "the host's storage is full"
			if errors.Is(err, errdefs.ErrNoSpace) {
				why = err.Error() // says how much, without host paths
			}
			return api.Snapshot{}, errdefs.New(errdefs.ErrNoSpace, "the snapshot of %s does not fit (%s); the sandbox is unchanged", id, why)
		}
		return api.Snapshot{}, err
	}
	snap, err = p.Commit(snap)
	if err != nil {
		return api.Snapshot{}, err
	}
	m.notify(b).Event(id, "snapshot", "snapshot taken", snap)
	m.log.Info("snapshot taken", "sandbox", id, "snapshot", snap.ID, "path", snap.Path, "frozen_ms", snap.FrozenMS, "total_ms", snap.TotalMS, "shared", snap.Shared)
	return snap, nil
}

// snapshot captures b into p and describes the capture.
func (m *Manager) snapshot(ctx context.Context, b *box, p *snapshot.Pending, req api.SnapshotRequest) (api.Snapshot, error) {
	return m.snapshotOf(ctx, b, p, req, 0)
}

// snapshotOf is snapshot; a directory snapshot holds the directory of
// b's container ci.
func (m *Manager) snapshotOf(ctx context.Context, b *box, p *snapshot.Pending, req api.SnapshotRequest, ci int) (api.Snapshot, error) {
	start := time.Now()
	dst := p.Path
	if req.Path != "" {
		dst = p.Path + ".full"
		defer os.Remove(dst)
	}
	b.mu.Lock()
	rec := b.rec.Sandbox
	// What the directory snapshot's container is made of: the first's
	// is the sandbox's own.
	image, env, workdir, vols, diskBytes := imageRef(rec), rec.Env, rec.Workdir, rec.Volumes, rec.Resources.DiskBytes
	container := ""
	if ci > 0 {
		c := b.rec.Containers[ci]
		container = c.Name
		image, env, workdir, vols = imageRef(api.Sandbox{Image: c.Image, ImageID: c.ImageID}), c.Env, c.Workdir, b.rec.Members[ci-1].Volumes
		if diskBytes = c.Resources.DiskBytes; diskBytes == 0 {
			diskBytes = m.cfg.Defaults.DiskBytes
		}
	} else if b.group() {
		container = b.rec.Containers[0].Name
	}
	for _, v := range vols {
		if req.Path != "" && (req.Path == v.Path || strings.HasPrefix(req.Path, v.Path+"/")) {
			b.mu.Unlock()
			return api.Snapshot{}, errdefs.Invalid("path", "%s is on a mounted volume, which a snapshot does not capture", req.Path)
		}
	}
	var c runtime.Capture
	var mem *api.SnapshotMemory
	var containers []api.Container
	var shared []api.SharedVolume
	var err error
	switch {
	case req.Memory:
		mem, err = m.memoryCaptureLocked(ctx, b, p.Checkpoint, func() (err error) {
			c, err = m.captureLocked(ctx, b, dst)
			return err
		})
	case req.Path != "":
		// One container's disk, in a freeze of the whole sandbox.
		c, err = m.captureDiskLocked(ctx, b, ci, dst)
	default:
		var all captured
		all, err = m.captureAllLocked(ctx, b, dst, p, false)
		c, containers, shared = all.disk, all.containers, all.shared
	}
	b.mu.Unlock()
	if err != nil {
		return api.Snapshot{}, err
	}
	b.touch()
	snap := api.Snapshot{
		Containers:     containers,
		SharedVolumes:  shared,
		Sandbox:        rec.ID,
		Path:           req.Path,
		Image:          image,
		Env:            env,
		Workdir:        workdir,
		Resources:      rec.Resources,
		Policy:         rec.Policy,
		Labels:         req.Labels,
		SizeBytes:      c.Size,
		AllocatedBytes: c.Allocated,
		FrozenMS:       ms(c.Frozen),
		Shared:         c.Shared,
		Memory:         mem,
	}
	if mem != nil {
		snap.FrozenMS = mem.StoppedMS
	}
	if req.Path != "" {
		snap.Container = container
		img, err := m.cfg.Images.Get(image)
		if err != nil {
			return api.Snapshot{}, err
		}
		if err := m.cfg.Snapshots.Extract(ctx, p, dst, img.Layers, req.Path, diskBytes); err != nil {
			return api.Snapshot{}, err
		}
		if fi, err := os.Stat(p.Path); err == nil {
			snap.SizeBytes = fi.Size()
			snap.AllocatedBytes = allocated(fi)
		}
	}
	snap.CreatedAt = time.Now().UTC()
	snap.TotalMS = ms(time.Since(start))
	return snap, nil
}

// captureDiskLocked copies the disk of b's container ci to dst: the
// first's, or a member's, freezing the whole sandbox for
// the moment of the copy if it runs.
func (m *Manager) captureDiskLocked(ctx context.Context, b *box, ci int, dst string) (runtime.Capture, error) {
	mv, err := next(b, actSnapshot)
	if err != nil {
		return runtime.Capture{}, err
	}
	if b.rec.ArchivedDisk != nil {
		return runtime.Capture{}, errdefs.Conflict("sandbox %s is archived: resume it first", b.rec.ID)
	}
	id, what := b.rec.ID, b.rec.ID
	if ci > 0 {
		c := b.rec.Containers[ci]
		id, what = runtime.ContainerID(b.rec.ID, c.Name), "container "+c.Name+" of "+b.rec.ID
		if mv.step == stepLive && (b.inst == nil || ci-1 >= len(b.members) || b.members[ci-1] == nil) {
			return runtime.Capture{}, errdefs.Conflict("container %s of sandbox %s is not running: %s", c.Name, b.rec.ID, c.Error)
		}
	}
	var pause func() (func(), error)
	if mv.step == stepLive {
		pause = m.freezeFor(ctx, b)
	}
	out, err := m.cfg.Runtime.Snapshot(ctx, id, dst, pause)
	if err != nil {
		return runtime.Capture{}, fmt.Errorf("capturing %s: %w", what, err)
	}
	return out, nil
}

// freezeFor is a capture's pause that freezes b's processes (its
// members' too: their groups are inside its own).
func (m *Manager) freezeFor(ctx context.Context, b *box) func() (func(), error) {
	inst := b.inst
	return func() (func(), error) {
		if err := inst.Freeze(ctx); err != nil {
			return nil, fmt.Errorf("freezing: %w", err)
		}
		return func() {
			if err := inst.Thaw(); err != nil {
				m.log.Error("thawing a sandbox after a snapshot", "sandbox", b.rec.ID, "err", err)
			}
		}, nil
	}
}

// captureLocked copies b's disk to dst, freezing its processes for the
// moment of the copy if they run.
func (m *Manager) captureLocked(ctx context.Context, b *box, dst string) (runtime.Capture, error) {
	return m.captureDiskLocked(ctx, b, 0, dst)
}

// memoryCaptureLocked checkpoints b's processes into dir (a new
// directory) and runs capture while they are stopped, so that what it
// copies matches the checkpoint; then they run on. It refuses a sandbox
// whose runtime keeps no memory, naming the runtime, and one whose
// processes do not run.
func (m *Manager) memoryCaptureLocked(ctx context.Context, b *box, dir string, capture func() error) (*api.SnapshotMemory, error) {
	id := b.rec.ID
	if !m.keepsMemory(b.rec.RuntimeName) {
		return nil, errdefs.Invalid("memory", "sandbox %s runs on the %s runtime, which keeps no memory: a memory snapshot or fork needs the gvisor runtime", id, b.rec.RuntimeName)
	}
	frozen := b.rec.State == api.StateFrozen
	if (b.rec.State != api.StateRunning && !frozen) || b.inst == nil {
		return nil, errdefs.Conflict("sandbox %s is %s: a memory snapshot or fork needs its processes running", id, b.rec.State)
	}
	if frozen {
		// The checkpoint is the sandbox's kernel's work: it must run.
		if err := b.inst.Thaw(); err != nil {
			return nil, fmt.Errorf("thawing %s: %w", id, err)
		}
		defer func() {
			if err := b.inst.Freeze(context.Background()); err != nil {
				m.log.Error("freezing a sandbox again after a memory snapshot", "sandbox", id, "err", err)
			}
		}()
	}
	ck, err := m.cfg.Runtime.(runtime.Checkpointer).CheckpointTo(ctx, id, dir, capture)
	if err != nil {
		m.log.Warn("memory snapshot", "sandbox", id, "err", err)
		select {
		case <-b.inst.Done():
			return nil, fmt.Errorf("checkpointing %s's processes: %w", id, err)
		default:
		}
		return nil, fmt.Errorf("%w: checkpointing %s's processes: %w; it runs on", errdefs.ErrConflict, id, err)
	}
	// The processes may run on in another host process (the gvisor
	// tier restores them): a restarted daemon must find that one.
	if st := b.inst.State(); !bytes.Equal(st, b.rec.Runtime) {
		b.rec.Runtime = st
		m.persistLocked(b)
	}
	m.log.Info("sandbox checkpointed for a snapshot", "sandbox", id, "bytes", ck.Bytes, "memory", ck.MemoryBytes, "stopped", ck.Stopped.Round(time.Microsecond))
	return &api.SnapshotMemory{
		Runtime:         b.rec.RuntimeName,
		CheckpointBytes: ck.Bytes,
		MemoryBytes:     ck.MemoryBytes,
		StoppedMS:       ms(ck.Stopped),
		Volumes:         b.rec.Volumes,
	}, nil
}

// KeepsMemory reports whether a snapshot or fork of sandbox id made now
// can keep its processes: its runtime keeps memory and they run.
func (m *Manager) KeepsMemory(id string) bool {
	b, err := m.lookup(id)
	if err != nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return m.keepsMemoryLocked(b)
}

func (m *Manager) keepsMemoryLocked(b *box) bool {
	return m.keepsMemory(b.rec.RuntimeName) && b.inst != nil &&
		(b.rec.State == api.StateRunning || b.rec.State == api.StateFrozen)
}

// keepsMemory reports whether runtime tier name checkpoints processes.
func (m *Manager) keepsMemory(name string) bool {
	r := m.cfg.Runtime
	if t, ok := r.(interface {
		Tier(string) (runtime.Runtime, error)
	}); ok {
		var err error
		if r, err = t.Tier(name); err != nil {
			return false
		}
	}
	_, ok := r.(runtime.Checkpointer)
	return ok
}

// captured is a capture of a sandbox's disks: for a group, also its
// containers and shared volumes as a create makes them again; with
// copies of its named volumes when asked, by volume.
type captured struct {
	disk       runtime.Capture
	containers []api.Container
	shared     []api.SharedVolume
	volumes    map[string]string
}

// captureAllLocked is captureLocked, or for a group captureGroupLocked
// into p (the first's disk to dst); with copyVolumes it copies the named
// volumes b mounts beside dst (a group's in the same freeze).
func (m *Manager) captureAllLocked(ctx context.Context, b *box, dst string, p *snapshot.Pending, copyVolumes bool) (captured, error) {
	var out captured
	var err error
	if !b.group() {
		if out.disk, err = m.captureLocked(ctx, b, dst); err == nil && copyVolumes {
			out.volumes, err = m.captureVolumesLocked(ctx, b, dst)
		}
		return out, err
	}
	to := groupDisks{first: dst, member: p.ContainerPath, shared: p.SharedPath}
	if copyVolumes {
		to.volumes = map[string]string{}
		for i, name := range b.rec.namedVolumes() {
			to.volumes[name] = fmt.Sprintf("%s.vol%d", dst, i)
		}
	}
	gc, err := m.captureGroupLocked(ctx, b, to)
	if err != nil {
		return out, err
	}
	out.disk, out.volumes = gc.sum(), to.volumes
	out.containers, out.shared = b.containerSpecs()
	return out, nil
}

// Fork makes req.Count new sandboxes from a capture of a running (or
// paused) sandbox. Each fork has its own copy of the disk; volumes are
// shared with the source unless req.CopyVolumes gives each its own copy.
// With memory (by default where the sandbox's runtime keeps it and its
// processes run) the capture is a memory snapshot's: every fork starts
// from the one checkpoint, with copies of the processes running.
func (m *Manager) Fork(ctx context.Context, id string, req api.ForkRequest) (api.ForkResult, error) {
	if m.cfg.Snapshots == nil {
		return api.ForkResult{}, errdefs.New(errdefs.ErrUnavailable, "snapshots are not configured")
	}
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 1 || req.Count > maxForks {
		return api.ForkResult{}, errdefs.Invalid("count", "%d is outside 1..%d", req.Count, maxForks)
	}
	if err := ValidateLabels(req.Labels); err != nil {
		return api.ForkResult{}, err
	}
	start := time.Now()
	b, err := m.lookup(id)
	if err != nil {
		return api.ForkResult{}, err
	}
	p, err := m.cfg.Snapshots.Begin()
	if err != nil {
		return api.ForkResult{}, err
	}
	defer p.Abort() // the capture is only a means here

	b.mu.Lock()
	rec := b.rec
	memory := req.Memory != nil && *req.Memory
	if req.Memory == nil {
		// Processes are kept where they can be.
		memory = m.keepsMemoryLocked(b)
	}
	var all captured
	capture := func() (err error) {
		all, err = m.captureAllLocked(ctx, b, p.Path, p, req.CopyVolumes)
		return err
	}
	var mem *api.SnapshotMemory
	if memory {
		mem, err = m.memoryCaptureLocked(ctx, b, p.Checkpoint, capture)
	} else {
		err = capture()
	}
	b.mu.Unlock()
	if err != nil {
		return api.ForkResult{}, err
	}
	b.touch()
	c, containers, shared := all.disk, all.containers, all.shared
	src := source{from: "fork:" + rec.ID, diskFrom: p.Path}
	if mem != nil {
		src.checkpoint = p.Checkpoint
	}
	if containers != nil {
		src.containerDisks = map[string]string{}
		for _, mc := range containers[1:] {
			src.containerDisks[mc.Name] = p.ContainerPath(mc.Name)
		}
		src.sharedFrom = map[string]string{}
		for _, v := range shared {
			src.sharedFrom[v.Name] = p.SharedPath(v.Name)
		}
	}

	labels := map[string]string{}
	for k, v := range rec.Labels {
		labels[k] = v
	}
	for k, v := range req.Labels {
		labels[k] = v
	}
	labels["paddock.fork-of"] = rec.ID
	if err := ValidateLabels(labels); err != nil {
		return api.ForkResult{}, err
	}
	base := api.CreateRequest{
		Image:            imageRef(rec.Sandbox),
		Runtime:          rec.RuntimeName, // a fork runs where its source does
		Env:              rec.Env,
		Workdir:          rec.Workdir,
		Resources:        rec.Resources,
		Labels:           labels,
		OnTimeout:        rec.OnTimeout,
		AutoPauseSeconds: rec.AutoPauseSeconds,
		AutoResume:       &rec.AutoResume,
		Volumes:          rec.Volumes,
		Policy:           rec.Policy,
	}
	if containers != nil {
		// Each fork makes its containers and shared volumes anew.
		base.Image, base.Env, base.Workdir, base.Volumes = "", nil, "", nil
		base.Containers, base.SharedVolumes = containers, shared
	}
	if rec.ExpiresAt != nil {
		base.TimeoutSeconds = int64(time.Until(*rec.ExpiresAt)/time.Second) + 1
	}
	out := make([]api.Sandbox, req.Count)
	errs := make([]error, req.Count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range req.Count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cr := base
			var made []string
			if req.CopyVolumes {
				var err error
				if made, err = m.copyVolumes(ctx, &cr, all.volumes); err != nil {
					errs[i] = err
					return
				}
			}
			out[i], errs[i] = m.create(ctx, cr, src)
			if errs[i] != nil {
				for _, name := range made {
					m.cfg.Volumes.Remove(context.Background(), name)
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			// All or nothing: remove the forks that were made.
			for _, s := range out {
				if s.ID != "" {
					m.Remove(context.Background(), s.ID, true)
				}
			}
			return api.ForkResult{}, fmt.Errorf("forking %s: %w", id, err)
		}
	}
	res := api.ForkResult{Sandboxes: out, FrozenMS: ms(c.Frozen), TotalMS: ms(time.Since(start)), Shared: c.Shared, Memory: mem}
	if mem != nil {
		res.FrozenMS = mem.StoppedMS
	}
	ids := make([]string, len(out))
	for i, s := range out {
		ids[i] = s.ID
	}
	m.notify(b).Event(id, "fork", fmt.Sprintf("forked into %d", len(out)), map[string]any{"sandboxes": ids, "frozen_ms": res.FrozenMS, "memory": mem != nil})
	m.log.Info("sandbox forked", "sandbox", id, "count", req.Count, "memory", mem != nil, "frozen_ms", res.FrozenMS, "total_ms", res.TotalMS)
	return res, nil
}

// captureVolumesLocked copies the volumes b mounts read-write, beside
// base, while b's processes are frozen; it returns the copies by volume.
func (m *Manager) captureVolumesLocked(ctx context.Context, b *box, base string) (map[string]string, error) {
	out := map[string]string{}
	mv, err := next(b, actSnapshot)
	if err != nil {
		return nil, err
	}
	for i, v := range b.rec.Volumes {
		if v.Name == "" || out[v.Name] != "" {
			continue
		}
		dst := fmt.Sprintf("%s.vol%d", base, i)
		var pause func() (func(), error)
		if mv.step == stepLive {
			inst := b.inst
			pause = func() (func(), error) {
				if err := inst.Freeze(ctx); err != nil {
					return nil, err
				}
				return func() { inst.Thaw() }, nil
			}
		}
		if err := m.cfg.Volumes.Capture(ctx, v.Name, dst, pause); err != nil {
			return nil, err
		}
		out[v.Name] = dst
	}
	return out, nil
}

// copyVolumes makes a new volume from each captured one (images, by
// volume) and points cr's mounts at the copies: a sandbox's, or each of
// its containers'. It returns the volumes it made; on failure it removes
// them.
func (m *Manager) copyVolumes(ctx context.Context, cr *api.CreateRequest, images map[string]string) (made []string, err error) {
	defer func() {
		if err != nil {
			for _, name := range made {
				m.cfg.Volumes.Remove(context.Background(), name)
			}
			made = nil
		}
	}()
	suffix := runtime.NewID()[:8]
	copies := map[string]string{}
	for _, v := range slices.Sorted(maps.Keys(images)) {
		name := v
		if len(name) > 64-len(suffix)-1 {
			name = name[:64-len(suffix)-1]
		}
		nv, err := m.cfg.Volumes.Create(ctx, api.VolumeRequest{Name: name + "-" + suffix}, images[v])
		if err != nil {
			return made, err
		}
		made = append(made, nv.Name)
		copies[v] = nv.Name
	}
	rename := func(vols []api.VolumeMount) []api.VolumeMount {
		out := slices.Clone(vols)
		for i, v := range out {
			if to, ok := copies[v.Name]; ok {
				out[i].Name = to
			}
		}
		return out
	}
	cr.Volumes = rename(cr.Volumes)
	cr.Containers = slices.Clone(cr.Containers)
	for i := range cr.Containers {
		// A shared volume's name is never a captured volume's: those are
		// named volumes outside the sandbox.
		cr.Containers[i].Mounts = rename(cr.Containers[i].Mounts)
	}
	return made, nil
}

// allocated is the space a file's data takes.
func allocated(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// fromMemory fills and checks req, a create from memory snapshot snap:
// the sandbox runs on the snapshot's runtime, mounts what its processes
// saw (the same volumes by default, or others at the same paths) and
// has room for their memory.
func fromMemory(req *api.CreateRequest, snap api.Snapshot) error {
	mem := snap.Memory
	switch req.Runtime {
	case "":
		req.Runtime = mem.Runtime
	case mem.Runtime:
	default:
		return errdefs.Invalid("runtime", "snapshot %s holds the memory of a %s sandbox: a sandbox made from it runs on %s, not %s", snap.ID, mem.Runtime, mem.Runtime, req.Runtime)
	}
	if len(req.Volumes) == 0 {
		req.Volumes = mem.Volumes
	} else if !samePaths(req.Volumes, mem.Volumes) {
		return errdefs.Invalid("volumes", "snapshot %s's processes saw mounts at %s: a sandbox made from it mounts volumes at those paths (or leave volumes out to mount the same)", snap.ID, mountPaths(mem.Volumes))
	}
	if lim := req.Resources.MemoryBytes; lim != 0 && lim < mem.MemoryBytes {
		return errdefs.Invalid("resources.memory_bytes", "snapshot %s's processes use %d bytes of memory, more than %d", snap.ID, mem.MemoryBytes, lim)
	}
	return nil
}

// samePaths reports whether a and b mount at the same paths, read-only
// alike.
func samePaths(a, b []api.VolumeMount) bool {
	if len(a) != len(b) {
		return false
	}
	type mount struct {
		path     string
		readOnly bool
	}
	seen := map[mount]bool{}
	for _, v := range a {
		seen[mount{v.Path, v.ReadOnly}] = true
	}
	for _, v := range b {
		if !seen[mount{v.Path, v.ReadOnly}] {
			return false
		}
	}
	return true
}

func mountPaths(vols []api.VolumeMount) string {
	if len(vols) == 0 {
		return "none"
	}
	paths := make([]string, len(vols))
	for i, v := range vols {
		paths[i] = v.Path
	}
	return strings.Join(paths, ", ")
}
