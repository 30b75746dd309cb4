// Package sandbox owns the sandbox lifecycle: the state machine
// (creating → running → stopped/failed → deleted), its records in the
// store, timeouts, and the reconcile that re-attaches to running sandboxes
// after a daemon restart and removes what was half made.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	goruntime "runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/archive"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/shrink"
	"github.com/paddock-dev/paddock/internal/snapshot"
	"github.com/paddock-dev/paddock/internal/storage/image"
	"github.com/paddock-dev/paddock/internal/store"
	"github.com/paddock-dev/paddock/internal/template"
	"github.com/paddock-dev/paddock/internal/turns"
	"github.com/paddock-dev/paddock/internal/volume"
)

const bucket = "sandboxes"

// Config configures a Manager.
type Config struct {
	// Runtime is set with SetRuntime when the runtime needs the manager
	// (as its IDs) to be built.
	Runtime runtime.Runtime
	Images  *image.Store
	Store   *store.Store
	// Volumes and Snapshots may be nil, which refuses their use.
	Volumes   *volume.Store
	Snapshots *snapshot.Store
	// Templates may be nil, which refuses templates.
	Templates *template.Store
	// Egress applies network policies; nil leaves sandboxes with no
	// network at all and refuses policies.
	Egress Egress
	// Defaults fill the resources a create leaves at zero.
	Defaults api.Resources
	// UIDStart is the first host uid handed to sandboxes; each sandbox
	// gets the next free range of 65536.
	UIDStart uint32
	// MaxSandboxes bounds the uid ranges (and so the sandboxes) in use.
	MaxSandboxes int
	// Node is the cluster node's name, recorded on every sandbox it
	// creates (api.Sandbox.Node); "" outside a cluster.
	Node string
	// AllowInsecureRegistries lets a pull ask for plain HTTP to registries
	// that are not on loopback.
	AllowInsecureRegistries bool
	// Archive, when set, is the object store paused sandboxes are
	// archived to (archive.go); Node names this node in it.
	Archive *archive.Store
	// ArchiveAfter archives paused sandboxes idle for that long (0:
	// only on request).
	ArchiveAfter time.Duration
	Logger       *slog.Logger
}

// Manager runs sandboxes.
type Manager struct {
	cfg Config
	log *slog.Logger
	obs Observer
	ctl Controls // control.go

	tpl templateState
	gp  groupPools // grouppool.go
	// turns orders the node's creates and process starts, as many at
	// once as the daemon has CPUs.
	turns *turns.Queue

	mu    sync.Mutex
	boxes map[string]*box
	// slots maps a uid range (by index from UIDStart) to the sandbox that
	// owns it; "" marks a range the runtime holds for a sandbox not made
	// yet.
	slots map[int]string
	// boxesPeak and slotsPeak are for shrink.Map.
	boxesPeak, slotsPeak int
	// moved names the node that took in each archived sandbox this node
	// held a stub of (archive.go): calls for it answer MovedError.
	moved map[string]string

	img imageState // images.go

	// tearQueue holds the teardowns waiting for one of the tearWorkers
	// (at most teardownWorkers) that run them (teardown.go).
	tearMu      sync.Mutex
	tearQueue   []*teardown
	tearWorkers int

	wg     sync.WaitGroup
	closed chan struct{}
}

// record is what the store keeps per sandbox.
type record struct {
	api.Sandbox
	// UIDBase is the sandbox's host uid range while it runs. A sandbox
	// started again may get another (rebase): its disk keeps canonical
	// owners and is mapped through the range of the day.
	UIDBase uint32          `json:"uid_base"`
	Runtime json.RawMessage `json:"runtime_state,omitempty"`
	// ArchivedDisk, when set, says the sandbox's disk is in the archive
	// and not here (archive.go).
	ArchivedDisk *archive.Disk `json:"archived_disk,omitempty"`
	// Members are its containers beside the first, in Containers' order
	// (containers.go).
	Members []memberRecord `json:"members,omitempty"`
	// Requests are its egress requests, oldest first (requests.go), and
	// RequestSeq the number of the last.
	Requests   []api.EgressRequest `json:"egress_requests,omitempty"`
	RequestSeq int                 `json:"egress_request_seq,omitempty"`
	// Previews are its preview URLs (previews.go).
	Previews []preview `json:"previews,omitempty"`
	// Pool names the warm pool ("template:NAME") that owns this group
	// until a create takes it, and PoolSpec what it was made from
	// (grouppool.go); "" once handed out.
	Pool     string `json:"pool,omitempty"`
	PoolSpec string `json:"pool_spec,omitempty"`
}

type box struct {
	mu    sync.Mutex
	rec   record
	inst  runtime.Instance
	guest *guestapi.Client
	// members are its running containers beside the first (containers.go).
	members  []*member
	timer    *time.Timer
	stopping bool // an exit of the guest is expected
	// gone is set (under Manager.mu) once its removal is acknowledged:
	// lookups no longer find it, while its id and uid range stay taken
	// until its teardown is done. torn (also under Manager.mu) is
	// closed when the teardown ends (teardown.go).
	gone bool
	torn chan struct{}
	// observed, when not nil, is closed once the observers have heard of
	// the create (see create and notify).
	observed chan struct{}
	// shown is the view last recorded, which List shows while another
	// call holds mu.
	shown atomic.Pointer[api.Sandbox]

	// lastActive and streams decide auto-pause; guarded by activity.
	activity   sync.Mutex
	lastActive time.Time
	streams    int

	// pooled: a warm pool's group not handed out yet (rec.Pool set),
	// which List leaves out; read without mu.
	pooled atomic.Bool
}

var _ runtime.IDs = (*Manager)(nil)

// Egress is what the manager needs of the egress path (package gateway).
type Egress interface {
	// ValidatePolicy checks a policy, naming its first bad entry.
	ValidatePolicy(p *api.Policy) error
	// SetPolicy applies a sandbox's policy (nil: nothing reachable) and
	// returns the environment of its secrets' placeholders.
	SetPolicy(id string, p *api.Policy) ([]string, error)
}

// NewManager returns a Manager; call SetRuntime and Reconcile before
// serving.
func NewManager(cfg Config) *Manager {
	if cfg.MaxSandboxes <= 0 {
		cfg.MaxSandboxes = 4096
	}
	m := &Manager{
		cfg:    cfg,
		log:    cfg.Logger,
		obs:    nopObserver{},
		boxes:  map[string]*box{},
		slots:  map[int]string{},
		moved:  map[string]string{},
		closed: make(chan struct{}),
		turns:  turns.New(goruntime.GOMAXPROCS(0), turns.Hold),
	}
	m.wg.Add(1)
	go m.autoPause(time.Second)
	if cfg.Archive != nil && cfg.ArchiveAfter > 0 {
		m.wg.Add(1)
		go m.archiveLoop(cfg.ArchiveAfter)
	}
	return m
}

func hostCPUs() int { return goruntime.NumCPU() }

// Len returns how many sandboxes the manager knows of, in any state.
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.boxes)
}

// SetRuntime sets the runtime sandboxes run on.
func (m *Manager) SetRuntime(rt runtime.Runtime) { m.cfg.Runtime = rt }

// Create validates req, starts a sandbox and returns it running.
func (m *Manager) Create(ctx context.Context, req api.CreateRequest) (api.Sandbox, error) {
	if err := validateCreate(&req, hostCPUs()); err != nil {
		return api.Sandbox{}, err
	}
	var src source
	if req.From != "" {
		if t, ok := m.groupTemplate(req.From); ok {
			return m.createFromGroup(ctx, req, t)
		}
		var err error
		if src, err = m.resolveFrom(&req); err != nil {
			return api.Sandbox{}, err
		}
		defer src.release()
	}
	return m.create(ctx, req, src)
}

// source is what a sandbox starts from besides its image: a copy of a
// captured disk and, from a memory snapshot, its checkpoint.
type source struct {
	from       string // recorded as the sandbox's From
	diskFrom   string
	checkpoint string
	// containerDisks are the disks of a group's members, by name;
	// sharedFrom the images of its shared volumes.
	containerDisks map[string]string
	sharedFrom     map[string]string
	release        func()
	// pool and poolSpec make the sandbox a warm pool's group
	// (record.Pool): hidden, its services at a background weight, no
	// event until it is handed out.
	pool, poolSpec string
}

// resolveFrom fills req from a snapshot named by req.From (its image,
// environment, workdir and limits, where req leaves them unset), or takes
// req.From as an image name.
func (m *Manager) resolveFrom(req *api.CreateRequest) (source, error) {
	// A template is its final snapshot, recorded under its name.
	from := ""
	if id, ok := m.templateSnapshot(req.From); ok {
		if req.Runtime == "" {
			req.Runtime = m.templateRuntime(req.From)
		}
		from, req.From = req.From, id
	}
	if !snapshot.IsID(req.From) {
		if req.Image != "" && req.Image != req.From {
			return source{}, errdefs.Invalid("from", "names image %q but image is %q", req.From, req.Image)
		}
		req.Image = req.From
		return source{release: func() {}}, nil
	}
	if m.cfg.Snapshots == nil {
		return source{}, errdefs.New(errdefs.ErrUnavailable, "snapshots are not configured")
	}
	snap, err := m.cfg.Snapshots.Get(req.From)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return source{}, errdefs.Invalid("from", "unknown snapshot %q", req.From)
		}
		return source{}, err
	}
	if snap.Path != "" {
		return source{}, errdefs.Invalid("from", "snapshot %s is of the directory %s; mount it with volumes instead", snap.ID, snap.Path)
	}
	if req.Image != "" && req.Image != snap.Image {
		return source{}, errdefs.Invalid("image", "%q differs from snapshot %s's image %q", req.Image, snap.ID, snap.Image)
	}
	if len(snap.Containers) > 0 && (len(req.Containers) > 0 || len(req.SharedVolumes) > 0 || len(req.Env) > 0 || req.Workdir != "" || len(req.Volumes) > 0) {
		return source{}, errdefs.Invalid("from", "snapshot %s holds a sandbox of several containers: its containers (their env, workdir and mounts) and shared volumes are the snapshot's", snap.ID)
	}
	req.Image = snap.Image
	if len(snap.Env) > 0 {
		env := make(map[string]string, len(snap.Env)+len(req.Env))
		for k, v := range snap.Env {
			env[k] = v
		}
		for k, v := range req.Env {
			env[k] = v
		}
		req.Env = env
	}
	if req.Workdir == "" {
		req.Workdir = snap.Workdir
	}
	if req.Policy == nil {
		req.Policy = snap.Policy
	}
	r := &req.Resources
	if r.CPUs == 0 {
		r.CPUs = snap.Resources.CPUs
	}
	if r.MemoryBytes == 0 {
		r.MemoryBytes = snap.Resources.MemoryBytes
	}
	if r.Pids == 0 {
		r.Pids = snap.Resources.Pids
	}
	if r.DiskBytes != 0 && r.DiskBytes != snap.SizeBytes {
		return source{}, errdefs.Invalid("resources.disk_bytes", "a sandbox made from snapshot %s keeps its disk size of %d bytes", snap.ID, snap.SizeBytes)
	}
	r.DiskBytes = snap.SizeBytes
	img, err := m.cfg.Snapshots.ImagePath(snap.ID)
	if err != nil {
		return source{}, err
	}
	if snap.Memory != nil {
		if err := fromMemory(req, snap); err != nil {
			return source{}, err
		}
	}
	var disks, shared map[string]string
	if len(snap.Containers) > 0 {
		// A group: its containers and shared volumes are the snapshot's
		// (checked above), and the first's image, env and workdir.
		req.Image, req.Env, req.Workdir = "", nil, ""
		req.Containers = append([]api.Container(nil), snap.Containers...)
		req.SharedVolumes = append([]api.SharedVolume(nil), snap.SharedVolumes...)
		disks = map[string]string{}
		for _, c := range snap.Containers[1:] {
			if disks[c.Name], err = m.cfg.Snapshots.ContainerImagePath(snap.ID, c.Name); err != nil {
				return source{}, err
			}
		}
		for _, v := range snap.SharedVolumes {
			p, err := m.cfg.Snapshots.SharedImagePath(snap.ID, v.Name)
			if err != nil {
				return source{}, err
			}
			if _, err := os.Stat(p); err == nil { // snapshots before shared volumes were captured have none
				if shared == nil {
					shared = map[string]string{}
				}
				shared[v.Name] = p
			}
		}
	}
	// Held while it is copied, so that a removal waits for the copy.
	holder := "creating:" + runtime.NewID()
	if err := m.cfg.Snapshots.Hold(snap.ID, holder); err != nil {
		return source{}, err
	}
	release := func() { m.cfg.Snapshots.Drop(snap.ID, holder) }
	checkpoint := ""
	if snap.Memory != nil {
		if checkpoint, err = m.cfg.Snapshots.CheckpointPath(snap.ID); err != nil {
			release()
			return source{}, err
		}
	}
	if from == "" {
		from = snap.ID
	}
	return source{from: from, diskFrom: img, checkpoint: checkpoint, containerDisks: disks, sharedFrom: shared, release: release}, nil
}

func (m *Manager) create(ctx context.Context, req api.CreateRequest, src source) (api.Sandbox, error) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { m.log.Debug("create phases", phases...) }()
	if err := m.validatePolicy(req.Policy); err != nil {
		return api.Sandbox{}, err
	}
	m.img.mu.RLock() // the image stays until the sandbox is recorded
	defer m.img.mu.RUnlock()
	var grp *group
	if len(req.Containers) > 0 {
		var err error
		if grp, err = m.planGroup(&req, runtime.NewID(), m.withDefaults(req.Resources)); err != nil {
			return api.Sandbox{}, err
		}
		grp.diskFrom, grp.sharedFrom = src.containerDisks, src.sharedFrom
		grp.background = src.pool != ""
		// The first container is the sandbox's own guest.
		c0 := req.Containers[0]
		req.Image, req.Env, req.Workdir, req.Volumes = c0.Image, c0.Env, c0.Workdir, grp.vols[0]
	}
	img, err := m.cfg.Images.Get(req.Image)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return api.Sandbox{}, errdefs.Invalid("image", "unknown image %q", req.Image)
		}
		return api.Sandbox{}, err
	}
	res := m.withDefaults(req.Resources)
	workdir := req.Workdir
	if workdir == "" {
		workdir = img.Workdir
	}
	tier, err := m.tier(req.Runtime)
	if err != nil {
		return api.Sandbox{}, err
	}
	if grp != nil && tier != "native" {
		// Each container is a guest of its own sharing the first's
		// network namespace; under gVisor that namespace's interface is
		// the first's netstack's alone (docs/containers.md).
		return api.Sandbox{}, errdefs.Invalid("containers", "a sandbox of several containers runs on the native runtime only, not %s: its containers share one network namespace, whose interface gVisor's netstack takes whole; create it with runtime native", tier)
	}
	now := time.Now().UTC()
	rec := record{Sandbox: api.Sandbox{
		State:            api.StateCreating,
		RuntimeName:      tier,
		Image:            img.Name,
		ImageID:          img.ID,
		Env:              req.Env,
		Workdir:          workdir,
		Resources:        res,
		Labels:           req.Labels,
		CreatedAt:        now,
		OnTimeout:        req.OnTimeout,
		AutoPauseSeconds: req.AutoPauseSeconds,
		AutoResume:       req.AutoResume == nil || *req.AutoResume,
		Volumes:          req.Volumes,
		From:             src.from,
		Budget:           req.Budget,
		Autoscale:        req.Autoscale,
		Policy:           req.Policy,
		Node:             m.cfg.Node,
	}}
	if req.TimeoutSeconds > 0 {
		exp := now.Add(time.Duration(req.TimeoutSeconds) * time.Second)
		rec.ExpiresAt = &exp
	}
	if grp != nil {
		grp.record(&rec)
	}
	rec.Pool, rec.PoolSpec = src.pool, src.poolSpec

	select {
	case <-m.closed:
		return api.Sandbox{}, fmt.Errorf("%w: daemon is shutting down", errdefs.ErrUnavailable)
	default:
	}
	if src.checkpoint != "" && !m.keepsMemory(tier) {
		return api.Sandbox{}, errdefs.Invalid("runtime", "a sandbox started from a memory checkpoint needs a runtime that keeps memory (gvisor), not %s", tier)
	}
	spec := m.spec(&rec, img)
	spec.DiskFrom = src.diskFrom
	spec.CheckpointFrom = src.checkpoint
	// The guest activates just before the sandbox is recorded (see
	// PutQuick below); one that fails before is cleaned up by the runtime.
	spec.Held = true
	if grp != nil {
		// Its shared volumes are made before anything mounts them, under
		// the id planGroup chose.
		spec.ID = grp.id
		if err := m.makeShared(ctx, grp); err != nil {
			return api.Sandbox{}, err
		}
	}
	if len(req.Volumes) > 0 || grp != nil {
		// Not a warm guest: this sandbox is built now, under an id
		// chosen here so that its mounts can be recorded against it.
		if spec.ID == "" {
			spec.ID = runtime.NewID()
		}
		if spec.Mounts, err = m.mounts(ctx, spec.ID, req.Volumes); err != nil {
			m.releaseMounts(spec.ID, req.Volumes)
			m.dropShared(grp)
			return api.Sandbox{}, err
		}
		rec.ID = spec.ID // as the runtime will name it
		if err := m.withControl(&spec, &rec, 0); err != nil {
			m.releaseMounts(spec.ID, req.Volumes)
			m.forgetControls(spec.ID)
			m.dropShared(grp)
			return api.Sandbox{}, err
		}
	}
	// Otherwise the runtime picks the id: a sandbox made ahead of time
	// already has one (its hostname, cgroup and disk are named by it).
	key := spec.ID
	if key == "" {
		key = "creating-" + runtime.NewID()
	}
	if err := m.obs.Admit(key, res); err != nil {
		if spec.ID != "" {
			m.releaseMounts(spec.ID, req.Volumes)
			m.forgetControls(spec.ID)
			m.dropShared(grp)
		}
		return api.Sandbox{}, err
	}
	mark("admitted")
	inst, err := m.startInstance(ctx, spec)
	mark("started")
	if err != nil {
		m.obs.Release(key)
		if spec.ID != "" {
			m.releaseMounts(spec.ID, req.Volumes)
			if err := m.cfg.Runtime.Remove(context.Background(), spec.ID); err != nil {
				m.log.Warn("removing a failed sandbox", "sandbox", spec.ID, "err", err)
			}
			m.forgetControls(spec.ID)
			m.dropShared(grp)
		}
		m.log.Warn("create failed", "err", err)
		if src.checkpoint != "" && errors.Is(err, runtime.ErrCheckpointUnusable) {
			return api.Sandbox{}, fmt.Errorf("%w: creating a sandbox from %s: %v; nothing was created", errdefs.ErrConflict, src.from, err)
		}
		return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
	}
	rec.ID = inst.ID()
	rec.State = api.StateRunning
	rec.Runtime = inst.State()
	rec.UIDBase = inst.Info().UIDBase
	// observed is closed by the observers' goroutine below, or here on
	// failure; it is set before anyone can look the sandbox up.
	b := &box{rec: rec, observed: make(chan struct{})}
	b.pooled.Store(rec.Pool != "")
	observing := false
	defer func() {
		if !observing {
			close(b.observed)
		}
	}()
	b.attach(inst, m.guestClient(inst))
	b.touch()
	b.mu.Lock()
	defer b.mu.Unlock()
	m.mu.Lock()
	_, dup := m.boxes[rec.ID]
	if !dup {
		m.boxes[rec.ID] = b
		m.slots[m.slotOf(rec.UIDBase)] = rec.ID
	}
	m.mu.Unlock()
	log := m.log.With("sandbox", rec.ID)
	if dup {
		m.obs.Release(key)
		inst.Kill()
		<-inst.Done()
		return api.Sandbox{}, fmt.Errorf("runtime reused sandbox id %s", rec.ID)
	}
	if grp != nil {
		if err := m.startGroup(ctx, b, grp); err != nil {
			m.obs.Release(key)
			m.unmake(b)
			m.dropShared(grp)
			m.log.Warn("create failed", "sandbox", rec.ID, "err", err)
			return api.Sandbox{}, fmt.Errorf("creating sandbox: %w", err)
		}
		mark("containers")
	}
	// The guest gets its Activate before the record is written: from then
	// on it serves without this daemon, so a record never names a guest
	// that a kill -9 left waiting for an Activate that will not come (it
	// would be found dead and the sandbox stopped). A kill between the
	// two leaves a guest no record names, which the next daemon removes
	// (the create never answered).
	activate(inst)
	mark("activated")
	// In the store's journal before the answer, synced right after it:
	// the record survives the daemon's death at once, and a host crash
	// once the sync is done (a crash before that ends the sandbox's
	// processes anyway; docs/ARCHITECTURE.md, "State and restarts").
	// Waiting for the disk's flush here would cost 0.3-4 ms on this path.
	if err := m.cfg.Store.PutQuick(bucket, rec.ID, b.rec); err != nil {
		m.obs.Release(key)
		m.unmake(b)
		m.dropShared(grp)
		return api.Sandbox{}, fmt.Errorf("recording sandbox: %w", err)
	}
	mark("recorded")
	m.watch(b, inst)
	m.armTimer(b)
	view := b.viewLocked()
	b.shown.Store(&view)
	// The observers hear of the sandbox after the answer: telemetry is not
	// needed for it (it opens the cgroup's files for sampling, records the
	// event). Whatever is done to the sandbox next (a stop, a removal)
	// reaches them after Running, in order: notify waits for observed, and
	// so do readers of its telemetry (Observed).
	observing = true
	go func() {
		defer close(b.observed)
		m.obs.Running(key, view)
		if rec.Pool != "" {
			log.Debug("group made for a warm pool", "pool", rec.Pool)
			return // its event is its hand-out's
		}
		m.obs.Event(rec.ID, "lifecycle", "created", map[string]any{"image": img.Name, "from": src.from})
		log.Info("sandbox created", "image", img.Name, "from", src.from, "cpus", res.CPUs, "memory", res.MemoryBytes, "volumes", len(rec.Volumes))
	}()
	return view, nil
}

// activate brings up a sandbox started Held until it no longer needs
// this daemon (its activation handed to its guest), so
// that an answer given to the caller survives the daemon's death:
// TestRestartDuringCreate.
func activate(inst runtime.Instance) {
	if a, ok := inst.(runtime.Activating); ok {
		a.Activate()
	}
}

// mounts records that sandbox id mounts vols and returns them as runtime
// mounts, attaching directory snapshots as needed. On failure what it
// recorded stays: the caller releases it if the sandbox is not kept.
func (m *Manager) mounts(ctx context.Context, id string, vols []api.VolumeMount) ([]runtime.Mount, error) {
	if len(vols) == 0 {
		return nil, nil
	}
	out := make([]runtime.Mount, 0, len(vols))
	var names []string
	for _, v := range vols {
		if v.Name != "" {
			names = append(names, v.Name)
		}
	}
	var paths []string
	if len(names) > 0 {
		if m.cfg.Volumes == nil {
			return nil, errdefs.New(errdefs.ErrUnavailable, "volumes are not configured")
		}
		var err error
		if paths, err = m.cfg.Volumes.Use(id, names); err != nil {
			return nil, err
		}
	}
	for _, v := range vols {
		mt := runtime.Mount{Dest: v.Path, ReadOnly: v.ReadOnly}
		if v.Name != "" {
			mt.Source, paths = paths[0], paths[1:]
		} else {
			if m.cfg.Snapshots == nil {
				return nil, errdefs.New(errdefs.ErrUnavailable, "snapshots are not configured")
			}
			p, err := m.cfg.Snapshots.Mount(ctx, v.Snapshot, id)
			if err != nil {
				return nil, err
			}
			mt.Source, mt.ReadOnly = p, true
		}
		out = append(out, mt)
	}
	return out, nil
}

// holdMounts records, without attaching anything, that sandbox id mounts
// vols (after a daemon restart).
func (m *Manager) holdMounts(id string, vols []api.VolumeMount) {
	for _, v := range vols {
		var err error
		switch {
		case v.Name != "" && m.cfg.Volumes != nil:
			_, err = m.cfg.Volumes.Use(id, []string{v.Name})
		case v.Snapshot != "" && m.cfg.Snapshots != nil:
			err = m.cfg.Snapshots.Hold(v.Snapshot, "sandbox:"+id)
		}
		if err != nil {
			m.log.Warn("a sandbox's volume is missing", "sandbox", id, "volume", v.Name+v.Snapshot, "err", err)
		}
	}
}

// releaseMounts forgets that sandbox id mounts vols.
func (m *Manager) releaseMounts(id string, vols []api.VolumeMount) {
	for _, v := range vols {
		switch {
		case v.Name != "" && m.cfg.Volumes != nil:
			m.cfg.Volumes.Release(id, []string{v.Name})
		case v.Snapshot != "" && m.cfg.Snapshots != nil:
			m.cfg.Snapshots.Unmount(v.Snapshot, id)
		}
	}
}

func (m *Manager) spec(rec *record, img *image.Image) runtime.Spec {
	spec := runtime.Spec{
		ID:        rec.ID,
		Runtime:   rec.RuntimeName,
		Image:     img,
		Resources: rec.Resources,
		Env:       imageEnv(img, rec.Env),
		Workdir:   rec.Workdir,
		UIDBase:   rec.UIDBase,
	}
	if m.cfg.Egress != nil {
		// The policy is in force before the sandbox's first process runs.
		policy := effectivePolicy(rec)
		spec.Setup = func(id string) ([]string, error) { return m.cfg.Egress.SetPolicy(id, policy) }
	}
	return spec
}

// tier resolves the runtime a create asks for: the daemon's default when
// it names none, so that the record keeps the tier its sandbox runs on.
func (m *Manager) tier(name string) (string, error) {
	if t, ok := m.cfg.Runtime.(interface {
		Tier(string) (runtime.Runtime, error)
	}); ok {
		r, err := t.Tier(name)
		if err != nil {
			return "", err
		}
		return r.Name(), nil
	}
	if name != "" && name != m.cfg.Runtime.Name() {
		return "", errdefs.Invalid("runtime", "unknown runtime %q (this daemon has %s)", name, m.cfg.Runtime.Name())
	}
	return m.cfg.Runtime.Name(), nil
}

func (m *Manager) validatePolicy(p *api.Policy) error {
	if m.cfg.Egress == nil {
		if p != nil {
			return errdefs.New(errdefs.ErrUnavailable, "this daemon has no network egress; a policy cannot be applied")
		}
		return nil
	}
	return m.cfg.Egress.ValidatePolicy(p)
}

func (m *Manager) slotOf(base uint32) int { return int((base - m.cfg.UIDStart) / 65536) }

// Alloc implements runtime.IDs.
func (m *Manager) Alloc() (uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := 0; i < m.cfg.MaxSandboxes; i++ {
		if _, used := m.slots[i]; !used {
			m.slots[i] = ""
			return m.cfg.UIDStart + uint32(i)*65536, nil
		}
	}
	return 0, fmt.Errorf("%w: all %d uid ranges are in use", errdefs.ErrUnavailable, m.cfg.MaxSandboxes)
}

// rebase records that sandbox b now runs on the uid range at base (the
// runtime started it again on a guest made ahead of time, which brought
// its own range; its files have canonical owners, mapped to any range).
// The old range is free; the new one, which the runtime took with Alloc,
// is the sandbox's.
func (m *Manager) rebase(b *box, base uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := b.rec.UIDBase; old != 0 && m.slots[m.slotOf(old)] == b.rec.ID {
		delete(m.slots, m.slotOf(old))
		m.slots = shrink.Map(m.slots, &m.slotsPeak)
	}
	m.slots[m.slotOf(base)] = b.rec.ID
	b.rec.UIDBase = base
}

// Free implements runtime.IDs.
func (m *Manager) Free(base uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok := m.slots[m.slotOf(base)]; ok && id == "" {
		delete(m.slots, m.slotOf(base))
		m.slots = shrink.Map(m.slots, &m.slotsPeak)
	}
}

// startInstance starts spec on the runtime in its turn.
func (m *Manager) startInstance(ctx context.Context, spec runtime.Spec) (runtime.Instance, error) {
	release, err := m.turns.Create(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return m.cfg.Runtime.Start(ctx, spec)
}

// guestClient is the client of inst's guest, its process starts in the
// node's turns.
func (m *Manager) guestClient(inst runtime.Instance) *guestapi.Client {
	id := inst.ID()
	return guestapi.NewClient(inst.Dial).WithTurns(func(ctx context.Context) (func(), error) {
		return m.turns.Start(ctx, id)
	})
}

func (b *box) attach(inst runtime.Instance, guest *guestapi.Client) {
	b.inst = inst
	b.guest = guest
	// Dial waits until the guest may be called (its limits set).
	go b.guest.DialAhead()
	b.stopping = false
}

// detach forgets the instance of a sandbox that no longer runs.
func (b *box) detach() {
	if b.guest != nil {
		b.guest.Close()
	}
	b.inst = nil
	b.guest = nil
}

func (b *box) viewLocked() api.Sandbox {
	s := b.rec.Sandbox
	b.activity.Lock()
	if !b.lastActive.IsZero() {
		t := b.lastActive.UTC()
		s.LastActiveAt = &t
	}
	b.activity.Unlock()
	if b.inst != nil {
		info := b.inst.Info()
		s.Runtime = &info
	}
	s.Archived = b.rec.ArchivedDisk != nil
	b.containersView(&s)
	return s
}

// forget drops a sandbox from memory and frees its uid range.
func (m *Manager) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b, ok := m.boxes[id]; ok {
		if b.rec.UIDBase != 0 && m.slots[m.slotOf(b.rec.UIDBase)] == id {
			delete(m.slots, m.slotOf(b.rec.UIDBase))
			m.slots = shrink.Map(m.slots, &m.slotsPeak)
		}
		for _, mr := range b.rec.Members {
			if mr.UIDBase != 0 && m.slots[m.slotOf(mr.UIDBase)] == id {
				delete(m.slots, m.slotOf(mr.UIDBase))
			}
		}
		delete(m.boxes, id)
		m.boxes = shrink.Map(m.boxes, &m.boxesPeak)
	}
}

// watch notices a guest that exits while the sandbox should be running:
// through the instance's own watcher where it offers one (no goroutine
// parked per sandbox, issue 21), else on a goroutine waiting for Done.
func (m *Manager) watch(b *box, inst runtime.Instance) {
	if w, ok := inst.(runtime.ExitWatcher); ok {
		w.OnExit(func() {
			// Close waits for what started before it closed m.closed.
			m.mu.Lock()
			select {
			case <-m.closed:
				m.mu.Unlock()
				return
			default:
			}
			m.wg.Add(1)
			m.mu.Unlock()
			defer m.wg.Done()
			m.exited(b, inst)
		})
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-inst.Done():
		case <-m.closed:
			return
		}
		m.exited(b, inst)
	}()
}

// exited marks b failed when its guest inst exited while it should run.
func (m *Manager) exited(b *box, inst runtime.Instance) {
	why := "the sandbox's init process exited"
	if a, ok := inst.(runtime.Activating); ok {
		if err := a.StartErr(); err != nil {
			why = err.Error()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inst != inst || b.stopping {
		return
	}
	mv, err := next(b, actExit)
	if err != nil {
		return
	}
	m.log.Warn("sandbox guest exited unexpectedly", "sandbox", b.rec.ID, "why", why)
	b.rec.State = mv.to
	b.rec.Error = why
	b.detach()
	if err := m.stopMembers(context.Background(), b); err != nil {
		m.log.Warn("releasing failed sandbox's containers", "sandbox", b.rec.ID, "err", err)
	}
	if err := m.cfg.Runtime.Stop(context.Background(), b.rec.ID); err != nil {
		m.log.Warn("releasing failed sandbox", "sandbox", b.rec.ID, "err", err)
	}
	m.persistLocked(b)
	m.notify(b).Stopped(b.viewLocked())
	m.notify(b).Event(b.rec.ID, "lifecycle", "failed", map[string]any{"error": b.rec.Error})
}

// notRunning is the error for a call that needs b running, with the
// reason a failed sandbox ended.
func notRunning(b *box) error {
	if b.rec.State == api.StateFailed && b.rec.Error != "" {
		return errdefs.Conflict("sandbox %s is failed, not running: %s", b.rec.ID, b.rec.Error)
	}
	return errdefs.Conflict("sandbox %s is %s, not running", b.rec.ID, b.rec.State)
}

// Observed waits until the observers have heard of sandbox id's create,
// so that its telemetry can be read right after the create answered.
func (m *Manager) Observed(ctx context.Context, id string) error {
	b, err := m.lookup(id)
	if err != nil {
		return err
	}
	if b.observed != nil {
		select {
		case <-b.observed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// notify returns the observers for a call about b, once they have heard
// of its create: what happens to a sandbox reaches them in order.
func (m *Manager) notify(b *box) Observer {
	if b.observed != nil {
		<-b.observed
	}
	return m.obs
}

func (m *Manager) persistLocked(b *box) {
	view := b.viewLocked()
	b.shown.Store(&view)
	if err := m.cfg.Store.Put(bucket, b.rec.ID, b.rec); err != nil {
		m.log.Error("recording sandbox", "sandbox", b.rec.ID, "err", err)
	}
}

// armTimer starts b's timeout from its record (so that it is the same
// after a restart): at ExpiresAt the sandbox is removed, or paused when
// its OnTimeout says so. b.mu is held.
func (m *Manager) armTimer(b *box) {
	if b.rec.ExpiresAt == nil {
		return
	}
	if b.timer != nil {
		b.timer.Stop()
	}
	id := b.rec.ID
	if b.rec.OnTimeout == api.TimeoutPause {
		b.timer = time.AfterFunc(time.Until(*b.rec.ExpiresAt), func() { m.pauseOnTimeout(b) })
		return
	}
	b.timer = time.AfterFunc(time.Until(*b.rec.ExpiresAt), func() {
		m.log.Info("sandbox timed out", "sandbox", id)
		if err := m.Remove(context.Background(), id, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Warn("removing timed-out sandbox", "sandbox", id, "err", err)
		}
	})
}

// pauseOnTimeout pauses b when its timeout is up and clears the timeout:
// a paused sandbox is kept until it is resumed or removed.
func (m *Manager) pauseOnTimeout(b *box) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := m.lookup(b.rec.ID); err != nil {
		return // removed
	}
	if b.rec.ExpiresAt == nil || time.Now().Before(*b.rec.ExpiresAt) {
		return // the timeout was cleared or moved while this one fired
	}
	b.timer = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch err := m.pauseLocked(ctx, b, actPause); {
	case err == nil:
		m.log.Info("sandbox timed out: paused", "sandbox", b.rec.ID)
	case errors.Is(err, errdefs.ErrConflict):
		// Stopped or failed: nothing to pause, and the timeout is spent.
	default:
		// Kept with its timeout: the next daemon tries again.
		m.log.Warn("pausing a sandbox whose timeout is up", "sandbox", b.rec.ID, "err", err)
		return
	}
	b.rec.ExpiresAt = nil
	m.persistLocked(b)
}

func (m *Manager) lookup(id string) (*box, error) {
	if err := reqcheck.SandboxID("id", id); err != nil {
		return nil, err
	}
	m.mu.Lock()
	b, ok := m.boxes[id]
	ok = ok && !b.gone
	node, moved := m.moved[id]
	m.mu.Unlock()
	switch {
	case ok:
		return b, nil
	case moved:
		return nil, &errdefs.MovedError{ID: id, Node: node}
	}
	return nil, errdefs.NotFound("sandbox", id)
}

// Get returns one sandbox.
func (m *Manager) Get(ctx context.Context, id string) (api.Sandbox, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State == api.StateCreating {
		return b.rec.Sandbox, nil
	}
	return b.viewLocked(), nil
}

// Filter selects sandboxes in List.
type Filter struct {
	// Labels must all match.
	Labels map[string]string
	State  api.State
}

// allBoxes returns every box the manager holds, for a walk that locks
// each on its own.
func (m *Manager) allBoxes() []*box {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Values(m.boxes))
}

// List returns the sandboxes matching f, oldest first.
func (m *Manager) List(ctx context.Context, f Filter) []api.Sandbox {
	m.mu.Lock()
	boxes := make([]*box, 0, len(m.boxes))
	for _, b := range m.boxes {
		if !b.gone && !b.pooled.Load() {
			boxes = append(boxes, b)
		}
	}
	m.mu.Unlock()
	out := []api.Sandbox{}
	for _, b := range boxes {
		// TryLock: a sandbox another call holds (a create, a pause) is
		// listed as last recorded rather than making List wait for it.
		var s api.Sandbox
		if b.mu.TryLock() {
			s = b.viewLocked()
			b.mu.Unlock()
		} else if v := b.shown.Load(); v != nil {
			s = *v
		} else {
			s = api.Sandbox{ID: b.rec.ID, State: api.StateCreating}
		}
		if f.State != "" && s.State != f.State {
			continue
		}
		match := true
		for k, v := range f.Labels {
			if s.Labels[k] != v {
				match = false
				break
			}
		}
		if match {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// Stop ends a running sandbox's processes and keeps its filesystem.
func (m *Manager) Stop(ctx context.Context, id string) (api.Sandbox, error) {
	b, err := m.lookup(id)
	if err != nil {
		return api.Sandbox{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	mv, err := next(b, actStop)
	if err != nil {
		return api.Sandbox{}, err
	}
	if err := m.stopLocked(ctx, b); err != nil {
		return api.Sandbox{}, err
	}
	b.rec.State = mv.to
	m.persistLocked(b)
	view := b.viewLocked()
	m.notify(b).Stopped(view)
	m.notify(b).Event(id, "lifecycle", "stopped", nil)
	return view, nil
}

func (m *Manager) stopLocked(ctx context.Context, b *box) error {
	if b.rec.State == api.StateFrozen && b.inst != nil && len(b.members) > 0 {
		b.inst.Thaw() // its members' groups are inside its own
	}
	if err := m.stopMembers(ctx, b); err != nil {
		return err
	}
	if b.inst != nil {
		if b.rec.State == api.StateFrozen {
			// Frozen processes cannot die until they are thawed.
			b.inst.Thaw()
		}
		b.stopping = true
		if err := b.inst.Kill(); err != nil {
			return fmt.Errorf("killing sandbox: %w", err)
		}
		select {
		case <-b.inst.Done():
		case <-ctx.Done():
			return ctx.Err()
		}
		b.detach()
	}
	if err := m.cfg.Runtime.Stop(ctx, b.rec.ID); err != nil {
		return fmt.Errorf("stopping sandbox: %w", err)
	}
	return nil
}

// Remove removes a sandbox. A running sandbox is only removed with
// force. It answers once the removal is recorded and the sandbox's
// processes are killed; the rest of its teardown (cgroup, disk, network,
// run dir, uid range, record) follows in the background (teardown.go).
// From then on the sandbox is gone from Get and List.
func (m *Manager) Remove(ctx context.Context, id string, force bool) error {
	b, err := m.lookup(id)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := m.lookup(id); err != nil {
		return err // deleted while we waited for the lock
	}
	act := actRemove
	if force {
		act = actForceRemove
	}
	mv, err := next(b, act)
	if err != nil {
		return err
	}
	// Journaled, not committed: the tombstone survives a kill -9 of the
	// daemon at once (the next one finishes the teardown) and costs no
	// database commit on the answer's path.
	prev := b.rec.State
	b.rec.State = mv.to
	if err := m.cfg.Store.PutQuick(bucket, id, b.rec); err != nil {
		b.rec.State = prev
		return fmt.Errorf("recording the removal: %w", err)
	}
	if b.timer != nil {
		b.timer.Stop()
	}
	m.mu.Lock()
	b.gone = true
	m.mu.Unlock()
	if b.inst != nil {
		// SIGKILL to the guest ends its pid namespace: nothing of the
		// sandbox runs, or reaches the network, after the answer. The
		// teardown waits for it to die.
		b.stopping = true
		if err := b.inst.Kill(); err != nil {
			m.log.Warn("killing a removed sandbox; its teardown kills its cgroup", "sandbox", id, "err", err)
		}
	}
	for _, mb := range b.members {
		if mb != nil {
			mb.inst.Kill()
		}
	}
	// Its processes are dying: what admission holds for it is free now,
	// so a create right after this answer is not refused for it.
	m.obs.Release(id)
	m.tearDown(b)
	m.log.Info("sandbox deleted", "sandbox", id)
	return nil
}

// Guest returns the guest client of a running sandbox.
func (m *Manager) Guest(ctx context.Context, id string) (*guestapi.Client, error) {
	b, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := m.wakeLocked(ctx, b); err != nil {
		return nil, err
	}
	if b.rec.State != api.StateRunning || b.guest == nil {
		return nil, notRunning(b)
	}
	b.touch()
	return b.guest, nil
}

// RunningGuest is Guest without the wake: the guest of a sandbox that is
// running now, or a conflict. A lane bound to a sandbox is opened this way:
// the guest serves it alone, so a frozen guest could not answer it, and the
// SDK opens one ahead of its next exec, which must not undo a freeze or a
// pause that came in between.
func (m *Manager) RunningGuest(ctx context.Context, id string) (*guestapi.Client, error) {
	b, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rec.State != api.StateRunning || b.guest == nil {
		return nil, notRunning(b)
	}
	b.touch()
	return b.guest, nil
}

// Done returns a channel closed when the sandbox's guest exits, for
// streams that must end with the sandbox.
func (m *Manager) Done(ctx context.Context, id string) (<-chan struct{}, error) {
	b, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.inst == nil {
		return nil, notRunning(b)
	}
	return b.inst.Done(), nil
}

// Load reads the records into memory, reserving their uid ranges. Call it
// before the runtime starts taking ranges, then Reconcile.
func (m *Manager) Load() error {
	err := m.cfg.Store.Each(bucket, func(key string, raw json.RawMessage) error {
		var r record
		if err := json.Unmarshal(raw, &r); err != nil {
			m.log.Error("skipping unreadable record", "sandbox", key, "err", err)
			return nil
		}
		if r.ArchivedDisk == nil { // an archived one's are in the archive
			m.holdMounts(r.ID, r.Volumes)
			for _, mr := range r.Members {
				m.holdMounts(runtime.ContainerID(r.ID, mr.Name), mr.Volumes)
			}
		}
		m.mu.Lock()
		b := &box{rec: r}
		b.pooled.Store(r.Pool != "")
		m.boxes[r.ID] = b
		if r.UIDBase != 0 {
			m.slots[m.slotOf(r.UIDBase)] = r.ID
		}
		for _, mr := range r.Members {
			if mr.UIDBase != 0 {
				m.slots[m.slotOf(mr.UIDBase)] = r.ID
			}
		}
		m.mu.Unlock()
		return nil
	})
	if err != nil {
		return fmt.Errorf("loading records: %w", err)
	}
	return m.loadMoved()
}

// Reconcile brings the host in line with the loaded records: running
// sandboxes are re-attached (or marked stopped if their guest is gone),
// host resources nobody recorded are removed, and timeouts re-armed.
func (m *Manager) Reconcile(ctx context.Context) error {
	boxes := m.allBoxes()
	known := map[string]bool{}
	for _, b := range boxes {
		b.mu.Lock()
		r := b.rec
		known[r.ID] = true
		for _, mr := range r.Members {
			known[runtime.ContainerID(r.ID, mr.Name)] = true
		}
		log := m.log.With("sandbox", r.ID)
		mv, err := next(b, actRestart)
		if err != nil {
			log.Warn("sandbox in an unknown state", "state", r.State)
		}
		switch mv.step {
		case stepAttach:
			inst, err := m.cfg.Runtime.Restore(ctx, r.ID, runtime.RestoreSpec{State: r.Runtime, Resources: r.Resources, Frozen: r.State == api.StateFrozen})
			if err != nil {
				log.Warn("sandbox did not survive; marking it stopped", "err", err)
				if err := m.stopMembers(ctx, b); err != nil {
					log.Warn("releasing sandbox's containers", "err", err)
				}
				if err := m.cfg.Runtime.Stop(ctx, r.ID); err != nil {
					log.Warn("releasing sandbox", "err", err)
				}
				lost, _ := next(b, actLost)
				b.rec.State = lost.to
				b.rec.Error = "the sandbox ended while the daemon was down"
				m.persistLocked(b)
				break
			}
			b.attach(inst, m.guestClient(inst))
			m.watch(b, inst)
			m.restoreMembers(ctx, b)
			m.reopenControls(b)
			m.superviseAll(b)
			if m.cfg.Egress != nil {
				if _, err := m.cfg.Egress.SetPolicy(r.ID, effectivePolicy(&b.rec)); err != nil {
					log.Warn("restoring the network policy", "err", err)
				}
			}
			m.obs.Running(r.ID, b.viewLocked())
			log.Info("sandbox re-attached")
		case stepRemove:
			// A create the daemon did not finish, or a removal it
			// acknowledged and did not finish: the teardown takes it up.
			if b.rec.State != mv.to {
				b.rec.State = mv.to
				if err := m.cfg.Store.PutQuick(bucket, r.ID, b.rec); err != nil {
					log.Warn("recording the removal", "err", err)
				}
			}
			m.mu.Lock()
			b.gone = true
			m.mu.Unlock()
			log.Info("finishing the teardown of a removed sandbox", "was", r.State)
			m.tearDown(b)
			b.mu.Unlock()
			continue
		}
		if p := b.rec.Paused; p != nil && p.Compressing && b.rec.State == api.StatePaused {
			// The daemon stopped while compressing its checkpoint.
			if c, ok := m.cfg.Runtime.(runtime.Checkpointer); ok {
				go m.settleCheckpoint(b, p, c.Squeeze(r.ID))
			}
		}
		m.armTimer(b)
		b.mu.Unlock()
	}
	left, err := m.cfg.Runtime.Leftovers()
	if err != nil {
		return fmt.Errorf("listing leftovers: %w", err)
	}
	for _, id := range left {
		if known[id] {
			continue
		}
		m.log.Info("removing leftovers of an unrecorded sandbox", "sandbox", id)
		if err := m.cfg.Runtime.Remove(ctx, id); err != nil {
			m.log.Warn("removing leftovers", "sandbox", id, "err", err)
		}
	}
	if m.cfg.Archive != nil {
		m.wg.Add(1)
		go m.checkArchived()
	}
	return nil
}

// Close stops the manager's goroutines. Sandboxes keep running: a new
// daemon re-attaches to them.
func (m *Manager) Close() {
	m.mu.Lock()
	select {
	case <-m.closed:
	default:
		close(m.closed)
	}
	for _, b := range m.boxes {
		if b.timer != nil {
			b.timer.Stop()
		}
	}
	m.mu.Unlock()
	m.wg.Wait()
}
