// Package native is paddock's default isolation tier: each sandbox is a
// user, mount, pid, net, ipc, uts and cgroup namespace around the guest as
// PID 1, on an overlayfs root whose writable layer is a size-capped volume,
// bounded by cgroup limits, Docker's capability set and seccomp profile.
//
// Guests are started ahead of time (a pool of processes waiting in fresh
// namespaces), because starting a Go process is most of a sandbox's start
// cost on small VMs; making a sandbox hands one its configuration.
package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"paddock/internal/cgroup"
	"paddock/internal/errdefs"
	"paddock/internal/guest"
	"paddock/internal/runtime"
	"paddock/internal/storage/disk"
	"paddock/internal/storage/image"
)

// Config configures the native runtime.
type Config struct {
	// RunDir holds one directory per sandbox: mount points, the guest's
	// control socket and its log.
	RunDir  string
	Cgroups *cgroup.Manager
	Disks   *disk.Pool
	// IDs hands out host uid ranges.
	IDs runtime.IDs
	// Seccomp is the compiled filter every sandbox runs under.
	Seccomp []byte
	// Caps is the capability set sandboxes keep.
	Caps []string
	// OutputLimit is the per-process output the guest retains.
	OutputLimit int64
	// WarmGuests is how many guests to keep started ahead of time, their
	// root filesystems built from WarmImage on a disk of WarmDiskBytes.
	WarmGuests    int
	WarmImage     func() (*image.Image, error)
	WarmDiskBytes int64
	Logger        *slog.Logger
}

// Runtime is the native tier.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	guestExe *os.File // sealed copy of our binary, exec'd as each guest
	warmDir  string
	warm     *cgroup.Group

	forkMu sync.Mutex
	forker *forker // started on first use, restarted if it dies

	mu    sync.Mutex
	idmap bool         // the kernel supports idmapped mounts of our layers
	ready []*guestProc // warm guests, oldest first

	refill chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
}

var _ runtime.Runtime = (*Runtime)(nil)

// New prepares the native runtime. Warm guests left by an earlier daemon
// are killed: they belong to no sandbox.
func New(cfg Config) (*Runtime, error) {
	r := &Runtime{
		cfg:     cfg,
		log:     cfg.Logger,
		warmDir: filepath.Join(cfg.RunDir, "warm"),
		idmap:   true,
		refill:  make(chan struct{}, 1),
		stop:    make(chan struct{}),
	}
	if err := os.MkdirAll(filepath.Join(cfg.RunDir, "sandboxes"), 0o711); err != nil {
		return nil, fmt.Errorf("creating run dir: %w", err)
	}
	if g, err := cfg.Cgroups.Load(warmCgroup); err == nil {
		g.Kill()
		if err := g.Delete(context.Background()); err != nil {
			return nil, fmt.Errorf("removing stale warm cgroup: %w", err)
		}
	}
	os.RemoveAll(r.warmDir)
	if err := os.MkdirAll(r.warmDir, 0o711); err != nil {
		return nil, err
	}
	vols, err := cfg.Disks.List()
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		if strings.HasPrefix(v, warmPrefix) {
			if err := cfg.Disks.Remove(context.Background(), v); err != nil {
				return nil, fmt.Errorf("removing stale warm disk: %w", err)
			}
		}
	}
	warm, err := cfg.Cgroups.Create(warmCgroup, cgroup.Limits{})
	if err != nil {
		return nil, fmt.Errorf("creating warm cgroup: %w", err)
	}
	r.warm = warm
	exe, err := sealedSelf()
	if err != nil {
		return nil, fmt.Errorf("sealing guest binary: %w", err)
	}
	r.guestExe = exe
	if cfg.WarmGuests > 0 {
		r.wg.Add(1)
		go r.keepWarm()
		r.poke()
	}
	return r, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "native" }

// fork has the forker start a guest, starting (or restarting) the forker
// when needed.
func (r *Runtime) fork(req forkRequest, fds []int) (int, int, error) {
	r.forkMu.Lock()
	defer r.forkMu.Unlock()
	for attempt := 0; ; attempt++ {
		if r.forker == nil {
			f, err := startForker(r.guestExe)
			if err != nil {
				return 0, -1, err
			}
			r.forker = f
		}
		pid, pidfd, err := r.forker.fork(req, fds)
		if err == nil || attempt > 0 || r.forker.alive() {
			return pid, pidfd, err
		}
		r.log.Warn("restarting the guest forker", "err", err)
		r.forker.close()
		r.forker = nil
	}
}

// Idmapped reports whether sandboxes get idmapped host files.
func (r *Runtime) Idmapped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idmap
}

// Warm reports how many guests are started ahead of time right now.
func (r *Runtime) Warm() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ready)
}

func (r *Runtime) poke() {
	select {
	case r.refill <- struct{}{}:
	default:
	}
}

// keepWarm keeps WarmGuests guests started, one at a time, backing off on
// errors.
func (r *Runtime) keepWarm() {
	defer r.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-r.stop:
			return
		case <-r.refill:
		}
		// Let a burst of creates finish before competing with it.
		for settled := false; !settled; {
			select {
			case <-r.stop:
				return
			case <-r.refill:
			case <-time.After(refillSettle):
				settled = true
			}
		}
		for {
			r.mu.Lock()
			need := len(r.ready) < r.cfg.WarmGuests
			r.mu.Unlock()
			if !need {
				break
			}
			g, err := r.newGuest()
			if err != nil {
				select {
				case <-r.stop:
					return
				default:
				}
				r.log.Warn("starting a warm guest", "err", err, "retry_in", backoff)
				select {
				case <-r.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(backoff*2, 30*time.Second)
				continue
			}
			backoff = 100 * time.Millisecond
			r.mu.Lock()
			r.ready = append(r.ready, g)
			r.mu.Unlock()
			select {
			case <-r.stop:
				return
			default:
			}
		}
	}
}

// refillSettle is how long the pool waits after a create before it
// starts another guest.
const refillSettle = 50 * time.Millisecond

// warmPrefix names the disks of warm guests; sandbox ids never start
// with it.
const warmPrefix = "warm-"

// newGuest starts a guest on a freshly allocated uid range and prepares
// its root filesystem from the warm image.
func (r *Runtime) newGuest() (_ *guestProc, retErr error) {
	img, err := r.cfg.WarmImage()
	if err != nil {
		return nil, err
	}
	base, err := r.cfg.IDs.Alloc()
	if err != nil {
		return nil, err
	}
	key := strconv.FormatUint(uint64(base), 10)
	g, err := r.spawnGuest(base, filepath.Join(r.warmDir, key))
	if err != nil {
		r.cfg.IDs.Free(base)
		return nil, err
	}
	defer func() {
		if retErr != nil {
			r.discard(g)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.prepare(ctx, g, img, warmPrefix+key, r.cfg.WarmDiskBytes); err != nil {
		return nil, err
	}
	return g, nil
}

// prepare gives g a disk (the volume named vol: opened if it exists, made
// otherwise) and has it build its root filesystem from img.
func (r *Runtime) prepare(ctx context.Context, g *guestProc, img *image.Image, vol string, size int64) error {
	uid := int(g.sb.st.UIDBase)
	v, err := r.volume(ctx, vol, size, uid)
	if err != nil {
		return err
	}
	g.volume = vol
	p := &guest.Prepare{}
	fds, idmapped, err := r.mountFDs(g.sb.st.PID, img, p)
	defer func() { closeFDs(fds) }()
	if err != nil {
		return err
	}
	add := func(fd int, err error) (guest.Mount, error) {
		if err != nil {
			return guest.Mount{}, err
		}
		fds = append(fds, fd)
		return guest.Mount{FD: len(fds) - 1}, nil
	}
	if p.Disk, err = add(treeClone(v.Path)); err != nil {
		return err
	}
	g.sb.st.Idmapped = idmapped
	if _, err := g.call(ctx, &guest.Config{Prepare: p}, fds, filepath.Join(g.dir, "guest.log")); err != nil {
		return fmt.Errorf("preparing rootfs: %w", err)
	}
	g.image = img.ID
	return nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// takeWarm returns a live warm guest prepared from img on a disk of
// size, if there is one.
func (r *Runtime) takeWarm(img *image.Image, size int64) *guestProc {
	if size != r.cfg.WarmDiskBytes {
		return nil
	}
	for {
		r.mu.Lock()
		var g *guestProc
		for i, c := range r.ready {
			if c.image == img.ID {
				g = c
				r.ready = append(r.ready[:i:i], r.ready[i+1:]...)
				break
			}
		}
		r.mu.Unlock()
		if g == nil || !g.sb.exited() {
			return g
		}
		r.discard(g)
	}
}

// discard kills a guest that will not become a sandbox, and frees its
// disk and uid range.
func (r *Runtime) discard(g *guestProc) {
	g.kill()
	if g.volume != "" {
		if err := r.cfg.Disks.Remove(context.Background(), g.volume); err != nil {
			r.log.Warn("removing a warm guest's disk", "disk", g.volume, "err", err)
		}
	}
	r.cfg.IDs.Free(g.sb.st.UIDBase)
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.RunDir, "sandboxes", id) }

// Start implements runtime.Runtime. A sandbox of the warm image and disk
// size takes a warm guest whose root filesystem is built already; any
// other starts a guest and builds it now.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (_ runtime.Instance, retErr error) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("start phases", append([]any{"sandbox", spec.ID}, phases...)...) }()

	dir := r.dir(spec.ID)
	var cleanups []func()
	defer func() {
		if retErr != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
		// Refill only now: starting a guest forks the daemon, and the
		// copy-on-write faults that follow would slow this start down.
		r.poke()
	}()
	var g *guestProc
	if spec.UIDBase == 0 {
		g = r.takeWarm(spec.Image, spec.Resources.DiskBytes)
	}
	if g != nil {
		mark("warm")
		cleanups = append(cleanups, func() { r.discard(g) })
		if err := os.Rename(g.dir, dir); err != nil {
			return nil, fmt.Errorf("moving guest dir: %w", err)
		}
		g.dir = dir
		if err := r.cfg.Disks.Rename(g.volume, spec.ID); err != nil {
			return nil, fmt.Errorf("moving guest disk: %w", err)
		}
		g.volume = spec.ID
	} else {
		base := spec.UIDBase
		if base == 0 {
			var err error
			if base, err = r.cfg.IDs.Alloc(); err != nil {
				return nil, err
			}
			cleanups = append(cleanups, func() { r.cfg.IDs.Free(base) })
		}
		var err error
		if g, err = r.spawnGuest(base, dir); err != nil {
			return nil, fmt.Errorf("starting guest: %w", err)
		}
		// On failure the guest dies, but a disk that existed before
		// (a stopped sandbox's) must survive.
		cleanups = append(cleanups, g.kill)
		mark("spawn")
		if err := r.prepare(ctx, g, spec.Image, spec.ID, spec.Resources.DiskBytes); err != nil {
			return nil, err
		}
		mark("prepare")
	}
	defer g.sync.Close()
	sb := g.sb
	sb.id = spec.ID
	sb.socket = filepath.Join(dir, "guest.sock")

	cg, err := r.cfg.Cgroups.Create(spec.ID, cgroup.Limits{
		CPUs: spec.Resources.CPUs, MemoryBytes: spec.Resources.MemoryBytes, Pids: spec.Resources.Pids,
	})
	if err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	cleanups = append(cleanups, func() {
		cg.Kill()
		cg.Delete(context.Background())
	})
	if err := cg.AddProc(sb.st.PID); err != nil {
		return nil, fmt.Errorf("moving guest into its cgroup: %w", err)
	}
	sb.cg = cg
	// Guests wait at a low priority; a sandbox runs at the normal one.
	raisePriority(sb.st.PID)
	mark("cgroup")

	oom, err := cg.OpenOOMEvents()
	if err != nil {
		return nil, fmt.Errorf("opening OOM events: %w", err)
	}
	defer oom.Close()
	act := &guest.Activate{
		ID:       spec.ID,
		Hostname: spec.ID,
		CgroupV2: r.cfg.Cgroups.Mode() == cgroup.V2,
		Seccomp:  r.cfg.Seccomp,
		Caps:     r.cfg.Caps,
		OOMFD:    0,
		Serve: guest.ServeConfig{
			Env:         spec.Env,
			Workdir:     spec.Workdir,
			OutputLimit: r.cfg.OutputLimit,
		},
	}
	ready, err := g.call(ctx, &guest.Config{Activate: act}, []int{int(oom.Fd())}, filepath.Join(dir, "guest.log"))
	if err != nil {
		return nil, fmt.Errorf("starting sandbox: %w", err)
	}
	mark("ready")
	if ready.PID != 1 {
		return nil, fmt.Errorf("guest reported pid %d, want 1", ready.PID)
	}
	st, err := procStartTime(sb.st.PID)
	if err != nil {
		return nil, err
	}
	sb.st.StartTime = st
	return sb, nil
}

// volume returns the sandbox's writable volume, with the overlay's upper
// and work dirs owned by the sandbox's root.
func (r *Runtime) volume(ctx context.Context, id string, size int64, uid int) (*disk.Volume, error) {
	vol, err := r.cfg.Disks.Open(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		vol, err = r.cfg.Disks.Acquire(ctx, id, size, uid, uid)
	}
	if err != nil {
		return nil, fmt.Errorf("getting disk: %w", err)
	}
	for _, d := range []string{"upper", "work"} {
		p := filepath.Join(vol.Path, d)
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			return nil, err
		}
		if err := os.Lchown(p, uid, uid); err != nil {
			return nil, err
		}
	}
	return vol, nil
}

// mountFDs fills p's layers and binds with descriptors. Where the kernel
// allows, each is a detached idmapped mount made here (it takes privilege
// in the initial user namespace), so that host files owned by root show as
// root in the sandbox instead of nobody; otherwise it is an O_PATH handle
// on the directory.
func (r *Runtime) mountFDs(pid int, img *image.Image, p *guest.Prepare) (fds []int, idmapped bool, err error) {
	srcs := append([]string(nil), img.Layers...)
	for _, b := range img.Binds {
		srcs = append(srcs, b.Source)
	}
	if r.Idmapped() {
		fds, err = r.idmappedFDs(pid, srcs)
		if err != nil {
			r.log.Warn("idmapped mounts unavailable; host files will show as nobody", "err", err)
			r.mu.Lock()
			r.idmap = false
			r.mu.Unlock()
		}
	}
	idmapped = fds != nil
	if !idmapped {
		for _, src := range srcs {
			fd, err := detachedTree(src, -1)
			if err != nil {
				closeFDs(fds)
				return nil, false, err
			}
			fds = append(fds, fd)
		}
	}
	for i, l := range img.Layers {
		p.Layers = append(p.Layers, guest.Mount{Source: l, FD: i})
	}
	for i, b := range img.Binds {
		p.Binds = append(p.Binds, guest.Mount{Source: b.Source, Dest: b.Dest, FD: len(img.Layers) + i})
	}
	return fds, idmapped, nil
}

// idmappedFDs makes an idmapped detached mount of each source through the
// user namespace of pid: all of them or none, since a half-idmapped
// rootfs would have inconsistent owners.
func (r *Runtime) idmappedFDs(pid int, srcs []string) ([]int, error) {
	userns, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return nil, fmt.Errorf("opening sandbox user namespace: %w", err)
	}
	defer userns.Close()
	var fds []int
	for _, src := range srcs {
		fd, err := detachedTree(src, int(userns.Fd()))
		if err != nil {
			closeFDs(fds)
			return nil, err
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// Restore implements runtime.Runtime.
func (r *Runtime) Restore(ctx context.Context, id string, raw []byte) (runtime.Instance, error) {
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return nil, fmt.Errorf("decoding state: %w", err)
	}
	// Open the pidfd first, then check the start time: if the pid was
	// reused in between, the check fails on the new process.
	pidfd, err := unix.PidfdOpen(st.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, errdefs.NotFound("guest process", strconv.Itoa(st.PID))
	}
	if t, err := procStartTime(st.PID); err != nil || t != st.StartTime {
		unix.Close(pidfd)
		return nil, errdefs.NotFound("guest process", strconv.Itoa(st.PID))
	}
	cg, err := r.cfg.Cgroups.Load(id)
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("loading cgroup: %w", err)
	}
	sb := &Sandbox{id: id, st: st, socket: filepath.Join(r.dir(id), "guest.sock"), cg: cg, done: make(chan struct{})}
	if err := sb.watch(pidfd); err != nil {
		return nil, err
	}
	// The guest must answer on its socket, or the sandbox is not usable.
	c := guest.NewClient(sb.Dial)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Do(pctx, guest.Request{Op: guest.OpPing}); err != nil {
		sb.Kill()
		return nil, fmt.Errorf("pinging guest: %w", err)
	}
	return sb, nil
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	cg, err := r.cfg.Cgroups.Load(id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if cg != nil {
		if err := cg.Kill(); err != nil {
			return fmt.Errorf("killing sandbox processes: %w", err)
		}
		if err := cg.Delete(ctx); err != nil {
			return fmt.Errorf("removing cgroup: %w", err)
		}
	}
	os.Remove(filepath.Join(r.dir(id), "guest.sock"))
	return nil
}

// Remove implements runtime.Runtime.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	if err := r.Stop(ctx, id); err != nil {
		return err
	}
	if err := r.cfg.Disks.Remove(ctx, id); err != nil {
		return fmt.Errorf("removing disk: %w", err)
	}
	if err := os.RemoveAll(r.dir(id)); err != nil {
		return fmt.Errorf("removing run dir: %w", err)
	}
	return nil
}

// Leftovers implements runtime.Runtime.
func (r *Runtime) Leftovers() ([]string, error) {
	cgs, err := r.cfg.Cgroups.List()
	if err != nil {
		return nil, err
	}
	vols, err := r.cfg.Disks.List()
	if err != nil {
		return nil, err
	}
	entries, _ := os.ReadDir(filepath.Join(r.cfg.RunDir, "sandboxes"))
	seen := map[string]bool{warmCgroup: true}
	var ids []string
	add := func(id string) {
		if !seen[id] && !strings.HasPrefix(id, warmPrefix) {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, id := range cgs {
		add(id)
	}
	for _, id := range vols {
		add(id)
	}
	for _, e := range entries {
		add(e.Name())
	}
	return ids, nil
}

// Close implements runtime.Runtime: warm guests are killed and their
// ranges freed; sandboxes keep running.
func (r *Runtime) Close() error {
	close(r.stop)
	r.wg.Wait()
	r.mu.Lock()
	ready := r.ready
	r.ready = nil
	r.mu.Unlock()
	for _, g := range ready {
		r.discard(g)
	}
	r.forkMu.Lock()
	if r.forker != nil {
		r.forker.close()
		r.forker = nil
	}
	r.forkMu.Unlock()
	r.warm.Kill()
	return r.warm.Delete(context.Background())
}
