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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/spare"
	"github.com/paddock-dev/paddock/internal/storage/disk"
	"github.com/paddock-dev/paddock/internal/storage/image"
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
	// SeccompBase and SeccompTail, when both are set, are Seccomp split
	// (seccomp.Split): each forker loads the base once and every guest
	// it forks inherits it; a guest loads the tail, not Seccomp, once
	// its set-up is done.
	SeccompBase, SeccompTail []byte
	// Caps is the capability set sandboxes keep.
	Caps []string
	// OutputLimit is the per-process output the guest retains.
	OutputLimit int64
	// WarmGuests is how many guests to keep started ahead of time, their
	// root filesystems built from WarmImage on a disk of WarmDiskBytes.
	WarmGuests    int
	WarmImage     func() (*image.Image, error)
	WarmDiskBytes int64
	WarmLimits    api.Resources // see runtime.PoolSource.Limits
	// BlankGuests is how many guests to keep started but bound to no
	// image or disk, for the starts no warm pool serves (blank_linux.go).
	BlankGuests int
	// GuestBinary is a static binary with the guest verbs (paddock-guest,
	// or paddock itself) exec'd as the forker and each guest; empty means
	// the slim guest this build embeds (internal/guestbin), or else this
	// process's own binary. Tests, whose binary is not paddock, set it.
	GuestBinary string
	// FastGuest is the fast guest (internal/guestc), which every guest
	// starts as and which hands over to GuestBinary for what it does not
	// serve: a path, or empty for the one this build embeds
	// (guestbin.Fast) when GuestBinary is empty too. NoFastGuest starts
	// every guest as GuestBinary.
	FastGuest   string
	NoFastGuest bool
	// Network wires each sandbox's network namespace to the egress path;
	// nil leaves sandboxes with loopback only.
	Network runtime.Network
	Logger  *slog.Logger
}

// Runtime is the native tier.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	guestExe *os.File // sealed copy of the guest binary (sealedSelf)
	fastExe  *os.File // sealed copy of the fast guest, or nil (sealedFast)
	warmDir  string   // run dirs of warm guests, until a create takes one
	blankDir string   // run dirs of blank guests (blank_linux.go)
	// runSpares are removed sandboxes' run dirs, emptied for the next
	// guests (RunDir/spare; spawnGuest, Remove).
	runSpares *spare.Pool

	// forkers holds forkerCount slots, each a forker (started on first
	// use, restarted if it dies) or nil; a fork takes a slot for its
	// request and gives it back, so that forks run side by side.
	forkers chan *forker

	mu    sync.Mutex
	idmap bool // the kernel supports idmapped mounts of our layers
	// pools hold warm guests by pool name, each list oldest first.
	pools map[string]*pool
	// building holds the ids of warm and blank guests being made.
	building map[string]bool
	// blank holds blank guests by kind, oldest first; blankBuilding
	// counts those being made.
	blank         [blankKinds][]*guestProc
	blankBuilding [blankKinds]int
	closing       bool
	// made is closed (and replaced) whenever the refill finishes a warm
	// guest, made or not, waking the creates waiting for one (takeWarm).
	made chan struct{}
	// evicting counts starts that evicted the warm and blank guests for
	// room and are retrying: the refill makes none meanwhile.
	evicting int
	// fresh are the sandboxes handed out from a pool whose guest has not
	// yet answered a first command, each with the time it stops counting;
	// missed says a create found a pool empty since the refill last
	// started a guest. The refill waits for them (refillWait).
	fresh  map[*Sandbox]time.Time
	missed bool

	refill chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
}

var _ runtime.Runtime = (*Runtime)(nil)

// New prepares the native runtime. Warm guests left by an earlier daemon
// belong to no sandbox: the manager's reconcile removes them as
// leftovers.
func New(cfg Config) (*Runtime, error) {
	r := &Runtime{
		cfg:      cfg,
		log:      cfg.Logger,
		warmDir:  filepath.Join(cfg.RunDir, "warm"),
		blankDir: filepath.Join(cfg.RunDir, "blank"),
		idmap:    true,
		building: map[string]bool{},
		pools:    map[string]*pool{},
		fresh:    map[*Sandbox]time.Time{},
		made:     make(chan struct{}),
		refill:   make(chan struct{}, 1),
		forkers:  make(chan *forker, forkerCount),
		stop:     make(chan struct{}),
	}
	if err := os.MkdirAll(filepath.Join(cfg.RunDir, "sandboxes"), 0o711); err != nil {
		return nil, fmt.Errorf("creating run dir: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.RunDir, "spare"), 0o700); err != nil {
		return nil, fmt.Errorf("creating run dir: %w", err)
	}
	var err error
	if r.runSpares, err = spare.Open(filepath.Join(cfg.RunDir, "spare")); err != nil {
		return nil, fmt.Errorf("creating run dir: %w", err)
	}
	// Warm guests of an earlier daemon: their run dirs, disks and network
	// state go now, their cgroups (named by sandbox ids nobody recorded)
	// at reconcile.
	// So do blank guests' (they have no disk).
	for _, d := range []string{r.warmDir, r.blankDir} {
		if cfg.Network == nil {
			break
		}
		if old, err := os.ReadDir(d); err == nil {
			for _, e := range old {
				cfg.Network.Forget(e.Name())
			}
		}
	}
	for _, d := range []string{r.warmDir, r.blankDir} {
		os.RemoveAll(d)
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, err
		}
	}
	vols, err := cfg.Disks.List()
	if err != nil {
		return nil, err
	}
	for _, v := range vols {
		if strings.HasPrefix(v, warmPrefix) {
			if err := cfg.Disks.Remove(context.Background(), v); err != nil {
				return nil, fmt.Errorf("removing a stale warm disk: %w", err)
			}
		}
	}
	exe, err := sealedSelf(cfg.GuestBinary)
	if err != nil {
		return nil, fmt.Errorf("sealing guest binary: %w", err)
	}
	r.guestExe = exe
	if r.fastExe, err = sealedFast(cfg); err != nil {
		exe.Close()
		return nil, fmt.Errorf("sealing the fast guest: %w", err)
	}
	for range forkerCount {
		r.forkers <- nil
	}
	r.poke() // blank guests
	if cfg.WarmGuests > 0 {
		r.SetPool(r.defaultPoolName(), runtime.PoolSource{Image: cfg.WarmImage, DiskBytes: cfg.WarmDiskBytes, Limits: cfg.WarmLimits}, cfg.WarmGuests)
	}
	r.wg.Add(1)
	go r.keepWarm()
	return r, nil
}

// split reports whether the sandboxes' filter is loaded in two parts.
func (r *Runtime) split() bool {
	return len(r.cfg.Seccomp) > 0 && len(r.cfg.SeccompBase) > 0 && len(r.cfg.SeccompTail) > 0
}

// seccompBase is what each forker loads: the split filter's base, or
// nothing.
func (r *Runtime) seccompBase() []byte {
	if r.split() {
		return r.cfg.SeccompBase
	}
	return nil
}

// guestFilter is what a guest loads once its set-up is done: the split
// filter's tail (its forker loaded the base), or the whole filter.
func (r *Runtime) guestFilter() []byte {
	if r.split() {
		return r.cfg.SeccompTail
	}
	return r.cfg.Seccomp
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "native" }

// forkerCount is how many forkers serve forks at once. A forker serves
// one fork at a time, and a fork into new namespaces is mostly the
// kernel's work (copying page tables, making namespaces) plus the
// guest's exec: with one forker, concurrent creates and the pools'
// refill queued behind each other (a third of the daemon's lock waits
// under 8 clients churning, issue 21). Each forker is a small idle
// process.
const forkerCount = 2

// fork has a forker start a guest, starting (or restarting) one when
// needed.
func (r *Runtime) fork(req forkRequest, fds []int) (int, int, error) {
	f := <-r.forkers
	defer func() { r.forkers <- f }()
	for attempt := 0; ; attempt++ {
		if f == nil {
			var err error
			if f, err = startForker(r.guestExe, r.fastExe, r.seccompBase()); err != nil {
				return 0, -1, err
			}
			r.forkerPidsGroup(f)
		}
		pid, pidfd, err := f.fork(req, fds)
		if err == nil || attempt > 0 || f.alive() {
			return pid, pidfd, err
		}
		r.log.Warn("restarting the guest forker", "err", err)
		f.close()
		f = nil
	}
}

// IsWarm reports whether id is a warm guest of this runtime (ready or
// being made).
func (r *Runtime) IsWarm(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.building[id] {
		return true
	}
	for _, list := range r.blank {
		for _, g := range list {
			if g.sb.id == id {
				return true
			}
		}
	}
	for _, p := range r.pools {
		for _, g := range p.ready {
			if g.sb.id == id {
				return true
			}
		}
	}
	return false
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
	n := 0
	for _, p := range r.pools {
		n += len(p.ready)
	}
	return n
}

// build makes a prepared guest for sandbox spec.ID: its cgroup (no limits
// yet), the guest process in it, its disk (kept if it exists: a sandbox
// started again; else new, or a copy of spec.DiskFrom) and its root
// filesystem. UIDBase 0 takes a new range. On failure everything it made
// is removed, except a disk that existed before.
func (r *Runtime) build(ctx context.Context, spec runtime.Spec, warm bool, urgent func() bool) (_ *guestProc, retErr error) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("build phases", append([]any{"sandbox", spec.ID, "warm", warm}, phases...)...) }()
	dir := r.dir(spec.ID)
	if warm {
		dir = filepath.Join(r.warmDir, spec.ID)
	}
	join, err := r.joinTarget(spec)
	if err != nil {
		return nil, err
	}
	g, undo, err := r.startGuest(spec.ID, spec.UIDBase, dir, warm, join)
	if err != nil {
		return nil, err
	}
	mark("guest")
	if warm && urgent != nil && urgent() {
		// A create waits for this warm guest: its disk and Prepare run
		// at the normal priority, not the refill's low one.
		raisePriority(g.sb.st.PID, g.sb.cg)
		g.raised = true
		mark("raised")
	}
	vol := spec.ID
	if warm {
		vol = warmPrefix + spec.ID
	}
	if err := r.bind(ctx, g, spec, vol, mark); err != nil {
		undo()
		return nil, err
	}
	return g, nil
}

// startGuest starts a guest for sandbox id in a new cgroup of that name
// (no limits yet), with dir as its run dir, on the uid range at uidBase
// (0 takes a new one); in join's network namespace when join is set (a
// container of that sandbox). undo removes all of it.
func (r *Runtime) startGuest(id string, uidBase uint32, dir string, warm bool, join *Sandbox) (_ *guestProc, _ func(), retErr error) {
	var cleanups []func()
	// Not the named result: a failing return sets that to nil before the
	// deferred undo runs.
	undo := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if retErr != nil {
			undo()
		}
	}()
	if uidBase == 0 {
		base, err := r.cfg.IDs.Alloc()
		if err != nil {
			return nil, nil, err
		}
		uidBase = base
		cleanups = append(cleanups, func() { r.cfg.IDs.Free(base) })
	}
	cg, err := r.cfg.Cgroups.Create(cgroupName(id), cgroup.Limits{})
	if err != nil {
		return nil, nil, fmt.Errorf("creating cgroup: %w", err)
	}
	cleanups = append(cleanups, func() {
		cg.Kill()
		cg.Delete(context.Background())
	})
	if warm {
		// Made ahead of time: it yields to running sandboxes until
		// raisePriority (the forker forks it at nice 10 too).
		if err := cg.SetBackground(true); err != nil {
			return nil, nil, err
		}
	}
	// A network slot when the network makes them: a namespace made and
	// wired ahead, which the guest is forked into; a container's is its
	// sandbox's.
	var netns runtime.NetNS
	if join != nil {
		jn, err := openNetns(join)
		if err != nil {
			return nil, nil, err
		}
		netns = jn
		cleanups = append(cleanups, jn.Close)
	} else if slots, ok := r.cfg.Network.(runtime.NetSlots); ok {
		if netns, err = slots.TakeNetns(); err != nil {
			return nil, nil, fmt.Errorf("taking a network slot: %w", err)
		}
		cleanups = append(cleanups, netns.Close)
	}
	g, err := r.spawnGuest(uidBase, dir, cg, warm, netns)
	if err != nil {
		return nil, nil, fmt.Errorf("starting guest: %w", err)
	}
	g.sb.id = id
	g.sb.cg = cg
	g.warm = warm
	if join != nil {
		// Its network is its sandbox's: nothing to wire, the same files
		// (resolver, CA) and environment (proxy), but for the hostname
		// file: its hostname is its own, which its guest writes.
		g.wired = true
		g.net = runtime.NetSetup{Env: join.net.Env}
		for _, f := range join.net.Files {
			if f.Dest != runtime.HostnamePath {
				g.net.Files = append(g.net.Files, f)
			}
		}
	}
	cleanups = append(cleanups, g.kill)
	return g, undo, nil
}

// bind makes started guest g sandbox spec.ID's: it wires its network and
// gets its disk (named vol) at the same time, then has the guest build
// its root filesystem. On failure it removes what it made (not a disk
// that existed before).
func (r *Runtime) bind(ctx context.Context, g *guestProc, spec runtime.Spec, vol string, mark func(string)) (retErr error) {
	var cleanups []func()
	defer func() {
		if retErr != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()
	// The two are independent and each costs milliseconds (a veth pair
	// and its addresses; a clone, a loop device and a mount).
	netErr := make(chan error, 1)
	wire := r.cfg.Network != nil && !g.wired
	if wire {
		go func() { netErr <- r.attachNetwork(g) }()
	} else {
		netErr <- nil
	}
	fresh := false
	v, err := r.cfg.Disks.Open(vol)
	if errors.Is(err, errdefs.ErrNotFound) {
		switch {
		case spec.DiskFrom != "" && g.warm:
			// A warm pool's guest: nobody waits for it, and the ready
			// clone is for those who do.
			v, err = r.cfg.Disks.CloneFrom(ctx, vol, spec.DiskFrom, 0, 0)
		case spec.DiskFrom != "":
			v, err = r.cfg.Disks.AcquireFrom(ctx, vol, spec.DiskFrom, 0, 0)
		case g.warm:
			// Its blocks are allocated when a create takes it (Rename).
			v, err = r.cfg.Disks.AcquireAhead(ctx, vol, spec.Resources.DiskBytes, 0, 0)
		default:
			v, err = r.cfg.Disks.Acquire(ctx, vol, spec.Resources.DiskBytes, 0, 0)
		}
		fresh = err == nil
	}
	if fresh {
		cleanups = append(cleanups, func() { r.cfg.Disks.Remove(context.Background(), vol) })
	}
	mark("disk")
	if nerr := <-netErr; nerr == nil && wire {
		id := g.sb.id
		cleanups = append(cleanups, func() { r.cfg.Network.Detach(id) })
	} else if nerr != nil {
		return nerr
	}
	if err != nil {
		return fmt.Errorf("getting disk: %w", err)
	}
	g.volume = vol
	mark("disk+net")
	if err := r.prepare(ctx, g, spec.Image, v, spec.Mounts, mark); err != nil {
		return err
	}
	mark("prepared")
	return nil
}

// prepare has g build its root filesystem from img on disk v, take the
// sandbox's hostname and cgroup namespace, and bound itself.
func (r *Runtime) prepare(ctx context.Context, g *guestProc, img *image.Image, v *disk.Volume, mounts []runtime.Mount, mark func(string)) error {
	// With idmapped mounts, a disk keeps canonical owners (root is uid 0
	// on disk) and is attached through the sandbox's user namespace, so
	// that it can be snapshotted, forked or resumed under any uid range.
	// Without them its files belong to the sandbox's range on the host.
	owner := 0
	if !r.Idmapped() {
		owner = int(g.sb.st.UIDBase)
	}
	for _, d := range []string{"upper", "work"} {
		p := filepath.Join(v.Path, d)
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			return err
		}
		if fi, err := os.Stat(p); err == nil && fi.Sys().(*syscall.Stat_t).Uid != 0 && owner == 0 {
			owner = int(fi.Sys().(*syscall.Stat_t).Uid) // a disk made without idmapping stays as it is
		}
	}
	for _, d := range []string{"", "upper", "work"} {
		if err := os.Lchown(filepath.Join(v.Path, d), owner, owner); err != nil {
			return err
		}
	}
	p := &guestapi.Prepare{
		Hostname: g.sb.id,
		CgroupV2: r.cfg.Cgroups.Mode() == cgroup.V2,
		Seccomp:  r.guestFilter(),
		Caps:     r.cfg.Caps,
		// base.go's images: sudo works, within Caps.
		AllowSetuid: img.AllowSetuid,
		// A guest made ahead of time has the time to warm up, unless a
		// create waits for it already (build raised it): the warm-up
		// would delay that create, and under churn, where each sandbox
		// runs one command, it costs a guest more CPU than it saves.
		SkipWarmUp: !g.warm || g.raised,
	}
	mark("owners")
	// The guest's user namespace, opened once for all the idmapped
	// mounts below (each open of /proc cost a path walk and, through
	// package os, seven more system calls: issue 21).
	userns := -1
	if r.Idmapped() {
		var err error
		if userns, err = openNS(g.sb.st.PID, "user"); err != nil {
			return fmt.Errorf("opening the sandbox's user namespace: %w", err)
		}
		defer unix.Close(userns)
	}
	fds, idmapped, err := r.mountFDs(userns, img, p)
	defer func() { closeFDs(fds) }()
	if err != nil {
		return err
	}
	mark("layers")
	add := func(fd int, err error) (int, error) {
		if err != nil {
			return -1, err
		}
		fds = append(fds, fd)
		return len(fds) - 1, nil
	}
	// What is idmapped goes through the guest's user namespace.
	mapThrough := -1
	if idmapped {
		mapThrough = userns
	}
	diskUserns := -1
	if owner == 0 {
		diskUserns = mapThrough
	}
	if p.Disk.FD, err = add(writableTree(v.Path, diskUserns, false)); err != nil {
		return err
	}
	if g.netns != nil {
		// The guest may not mount a sysfs of a namespace it does not
		// own: the network made one.
		i, err := add(g.netns.Sysfs())
		if err != nil {
			return fmt.Errorf("binding /sys: %w", err)
		}
		p.Binds = append(p.Binds, guestapi.Mount{Source: "sysfs", Dest: "/sys", FD: i})
		p.NetReady = true
	}
	for _, f := range g.net.Files {
		src := f.Source
		i, err := add(detachedTree(src, mapThrough, false))
		if err != nil {
			return fmt.Errorf("binding %s: %w", f.Dest, err)
		}
		p.Binds = append(p.Binds, guestapi.Mount{Source: src, Dest: f.Dest, FD: i, File: !f.Dir})
	}
	if len(mounts) > 0 && !idmapped {
		return fmt.Errorf("%w: volumes need idmapped mounts, which this kernel or filesystem lacks", errdefs.ErrUnavailable)
	}
	for _, m := range mounts {
		i, err := add(writableTree(m.Source, mapThrough, m.ReadOnly))
		if err != nil {
			return fmt.Errorf("mounting a volume at %s: %w", m.Dest, err)
		}
		p.Binds = append(p.Binds, guestapi.Mount{Source: m.Source, Dest: m.Dest, FD: i})
	}
	if p.OOMFD, err = add(openOOM(g.sb.cg)); err != nil {
		return err
	}
	if g.pidsApart {
		i, err := add(openPidsTasks(g.sb.cg))
		if err != nil {
			return err
		}
		p.PidsTasks = &i
	}
	g.sb.st.Idmapped = idmapped
	mark("binds")
	if _, err := g.call(ctx, &guestapi.Config{Prepare: p}, fds, filepath.Join(g.dir, "guest.log")); err != nil {
		return fmt.Errorf("preparing sandbox: %w", err)
	}
	g.image = img.ID
	return nil
}

// attachNetwork wires g's network namespace to the egress path.
func (r *Runtime) attachNetwork(g *guestProc) error {
	ns, err := openNS(g.sb.st.PID, "net")
	if err != nil {
		return fmt.Errorf("opening the guest's network namespace: %w", err)
	}
	defer unix.Close(ns)
	// The pid could have been reused if the guest died: check it is still
	// ours now that the namespace is open.
	if g.sb.exited() {
		return errors.New("guest exited before its network was wired")
	}
	setup, err := r.cfg.Network.Attach(g.sb.id, ns)
	if err != nil {
		return fmt.Errorf("wiring network: %w", err)
	}
	g.net = setup
	g.sb.st.Net = setup.State
	return nil
}

// openOOM opens the cgroup's OOM counter for a guest.
// openPidsTasks is openOOM for the group's v1 pids tasks file, which the
// guest's spawner thread joins the sandbox's pids group with.
func openPidsTasks(cg *cgroup.Group) (int, error) {
	f, err := cg.OpenPidsTasks()
	if err != nil {
		return -1, err
	}
	defer f.Close()
	return unix.Dup(int(f.Fd()))
}

func openOOM(cg *cgroup.Group) (int, error) {
	f, err := cg.OpenOOMEvents()
	if err != nil {
		return -1, fmt.Errorf("opening OOM events: %w", err)
	}
	defer f.Close()
	return unix.Dup(int(f.Fd()))
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// discard removes a guest that will not become a sandbox: its process
// and run dir, cgroup, disk and uid range.
func (r *Runtime) discard(g *guestProc) {
	g.sb.answeredFirst() // a hand-out whose start failed
	g.kill()
	if g.netns != nil {
		g.netns.Close() // a slot no sandbox was attached to
	}
	if r.cfg.Network != nil {
		r.cfg.Network.Forget(g.sb.id)
	}
	ctx := context.Background()
	if err := r.Stop(ctx, g.sb.id); err != nil {
		r.log.Warn("removing a guest's cgroup", "sandbox", g.sb.id, "err", err)
	}
	if g.volume != "" {
		if err := r.cfg.Disks.Remove(ctx, g.volume); err != nil {
			r.log.Warn("removing a guest's disk", "disk", g.volume, "err", err)
		}
	}
	r.cfg.IDs.Free(g.sb.st.UIDBase)
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.RunDir, "sandboxes", id) }

// Start implements runtime.Runtime. A sandbox of the warm image and disk
// size takes a warm guest, which is already that sandbox but for its
// limits and environment; any other builds one now.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (_ runtime.Instance, retErr error) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("start phases", append([]any{"sandbox", spec.ID}, phases...)...) }()
	// Refill only after this start: making a guest competes with it.
	defer r.poke()

	// A sandbox whose id the runtime picks is the runtime's to clean up
	// if it fails.
	picked := spec.ID == ""
	var g *guestProc
	if picked && len(spec.Mounts) == 0 {
		g = r.takeWarm(ctx, spec)
	}
	if g != nil {
		mark("taken")
		// It becomes the sandbox: its run dir and disk take their names.
		dir := r.dir(g.sb.id)
		if err := os.Rename(g.dir, dir); err != nil {
			r.discard(g)
			return nil, fmt.Errorf("moving guest dir: %w", err)
		}
		g.dir = dir
		g.sb.socket = filepath.Join(dir, "guest.sock")
		mark("dir")
		if err := r.cfg.Disks.Rename(g.volume, g.sb.id); err != nil {
			r.discard(g)
			return nil, fmt.Errorf("moving guest disk: %w", err)
		}
		g.volume = g.sb.id
		r.handedOut(g.sb)
		mark("warm")
	} else {
		var err error
		if g, err = r.startNew(ctx, &spec, mark); err != nil {
			if !roomErr(err) {
				return nil, err
			}
			// Refused for room the pools may hold: they give it up, and
			// the start is tried once more (pools never fail a create).
			n, done := r.evictWarm()
			defer done()
			mark("evicted")
			if n == 0 {
				return nil, err
			}
			r.log.Info("evicted warm guests for a start refused for room", "guests", n, "err", err)
			if picked {
				spec.ID = ""
			}
			if g, err = r.startNew(ctx, &spec, mark); err != nil {
				return nil, err
			}
		}
	}
	defer func() {
		if retErr == nil {
			return
		}
		if picked {
			r.discard(g) // nothing of it was the caller's
			return
		}
		g.kill()
		r.Stop(context.Background(), spec.ID)
		if g.sb.st.UIDBase != spec.UIDBase {
			r.cfg.IDs.Free(g.sb.st.UIDBase) // a blank guest's range
		}
	}()
	defer func() {
		if g.sync != nil {
			g.sync.Close()
		}
	}()
	sb := g.sb
	sb.net = g.net
	if jn, ok := g.netns.(*joinedNetns); ok {
		jn.Close() // the namespace is the sandbox's; the guest is in it
	}
	env := append(append([]string(nil), spec.Env...), g.net.Env...)
	if spec.Setup != nil {
		more, err := spec.Setup(sb.id)
		if err != nil {
			return nil, err
		}
		env = append(env, more...)
		mark("setup")
	}
	act := &guestapi.Activate{Serve: guestapi.ServeConfig{
		Env:         env,
		Workdir:     spec.Workdir,
		OutputLimit: r.cfg.OutputLimit,
	}}
	// The activation, the limits and the guest's answer are seen to
	// after Start: by the caller's Activate (spec.Held), or in the
	// background. Nothing the sandbox runs can start before Dial lets a
	// connection through, which waits for the limits and the thaw (the
	// guest's activation itself is our code, not the sandbox's). The sync
	// socket is the activation's to close.
	lim := limitsOf(spec.Resources)
	sync := g.sync
	g.sync = nil
	a := activation{act: act, sync: sync, logPath: filepath.Join(g.dir, "guest.log"), lim: lim, preset: g.limits, raised: g.raised}
	sb.activation = func() { r.activate(sb, a) }
	if spec.Held {
		// One that dies before its Activate still has its socket closed
		// and its waiters (Dial) told.
		sb.holdActivation()
	} else {
		go sb.activateOnce.Do(sb.activation)
	}
	return sb, nil
}

// startNew starts spec on a blank guest, or builds its guest now (no
// warm guest serves it); on failure nothing of it is left but a disk
// that existed before.
func (r *Runtime) startNew(ctx context.Context, spec *runtime.Spec, mark func(string)) (*guestProc, error) {
	if g := r.blankFor(*spec); g != nil {
		if err := r.bindBlank(ctx, g, spec, mark); err != nil {
			return nil, err
		}
		mark("bound")
		return g, nil
	}
	if spec.ID == "" {
		spec.ID = runtime.NewID()
	}
	g, err := r.build(ctx, *spec, false, nil)
	if err != nil {
		return nil, err
	}
	mark("built")
	return g, nil
}

// roomErr reports whether err refused a start for want of something warm
// and blank guests hold: disk space (a promise each), loop devices,
// memory.
func roomErr(err error) bool {
	return errors.Is(err, errdefs.ErrUnavailable) || errdefs.IsNoSpace(err) || errors.Is(err, syscall.ENOMEM)
}

// activation is what a sandbox's guest still needs once Start returns.
type activation struct {
	act     *guestapi.Activate
	sync    *os.File // the guest's sync socket, closed when done
	logPath string
	lim     cgroup.Limits
	// preset are the limits the guest's cgroup has already (a warm guest
	// of a pool with limits); raised: its threads run at the normal
	// priority already.
	preset cgroup.Limits
	raised bool
}

// activate sends sb's guest its Activate: then sent is closed, and the
// rest goes on in the background: the limits set and the guest raised to
// the normal priority (unless a warm guest has them already), its answer
// awaited and the outcome recorded in sb. A guest that fails tells why
// and exits; one that answers wrongly, or whose limits cannot be set, is
// killed, so that the sandbox ends (and is marked failed) either way.
func (r *Runtime) activate(sb *Sandbox, a activation) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	// The Activate goes into the guest's socket first: from then on the
	// guest serves even if this daemon dies, and a daemon that restarts
	// sets the limits (Restore). So the create answers now (see
	// Sandbox.Activate), and the rest follows in the background; nothing
	// of the sandbox's own runs before all of it is done (Dial waits).
	err := guestapi.SendConfig(a.sync, &guestapi.Config{Activate: a.act}, nil)
	mark("sent")
	close(sb.sent)
	go r.activated(sb, a, err, t0, phases)
}

// activated finishes what activate began, in the background.
func (r *Runtime) activated(sb *Sandbox, a activation, err error, t0 time.Time, phases []any) {
	defer a.sync.Close()
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	if a.lim != a.preset {
		if lerr := sb.cg.Update(a.lim); lerr != nil && err == nil {
			err = fmt.Errorf("setting limits: %w", lerr)
		}
		mark("limits")
	}
	// Guests start at a low priority; a sandbox runs at the normal one (a
	// thread at a time through /proc), before anything of its own: what
	// the guest forks has its forking thread's priority.
	if !a.raised {
		raisePriority(sb.st.PID, sb.cg)
		mark("priority")
	}
	// Limited: Dial may connect; the guest accepts once it has activated.
	sb.limitErr = err
	close(sb.limited)
	var rd *guestapi.Ready
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		rd, err = guestapi.WaitReady(ctx, a.sync, sb.done)
		cancel()
	}
	mark("ready")
	r.log.Debug("activate phases", append([]any{"sandbox", sb.id}, phases...)...)
	if err == nil && rd.PID != 1 {
		err = fmt.Errorf("guest reported pid %d, want 1", rd.PID)
	}
	if err != nil {
		err = fmt.Errorf("%w%s", err, guestapi.LogTail(a.logPath))
		r.log.Warn("sandbox guest did not start serving", "sandbox", sb.id, "err", err)
		sb.activeErr = err
		sb.Kill()
	}
	close(sb.active)
}

// limitsOf is a sandbox's resources as cgroup limits.
func limitsOf(res api.Resources) cgroup.Limits {
	return cgroup.Limits{CPUs: res.CPUs, MemoryBytes: res.MemoryBytes, Pids: res.Pids}
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// mountFDs fills p's layers and binds with descriptors. Where the kernel
// allows, each is a detached idmapped mount made here (it takes privilege
// in the initial user namespace), so that host files owned by root show as
// root in the sandbox instead of nobody; otherwise it is an O_PATH handle
// on the directory.
func (r *Runtime) mountFDs(userns int, img *image.Image, p *guestapi.Prepare) (fds []int, idmapped bool, err error) {
	srcs := append([]string(nil), img.Layers...)
	for _, b := range img.Binds {
		srcs = append(srcs, b.Source)
	}
	if userns >= 0 {
		fds, err = idmappedFDs(userns, srcs, img.AllowSetuid)
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
			fd, err := detachedTree(src, -1, img.AllowSetuid)
			if err != nil {
				closeFDs(fds)
				return nil, false, err
			}
			fds = append(fds, fd)
		}
	}
	for i, l := range img.Layers {
		p.Layers = append(p.Layers, guestapi.Mount{Source: l, FD: i})
	}
	for i, b := range img.Binds {
		p.Binds = append(p.Binds, guestapi.Mount{Source: b.Source, Dest: b.Dest, FD: len(img.Layers) + i})
	}
	return fds, idmapped, nil
}

// idmappedFDs makes an idmapped detached mount of each source through the
// user namespace userns: all of them or none, since a half-idmapped
// rootfs would have inconsistent owners.
func idmappedFDs(userns int, srcs []string, setuid bool) ([]int, error) {
	var fds []int
	for _, src := range srcs {
		fd, err := detachedTree(src, userns, setuid)
		if err != nil {
			closeFDs(fds)
			return nil, err
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// Restore implements runtime.Runtime.
func (r *Runtime) Restore(ctx context.Context, id string, rs runtime.RestoreSpec) (runtime.Instance, error) {
	var st state
	if err := json.Unmarshal(rs.State, &st); err != nil {
		return nil, fmt.Errorf("decoding state: %w", err)
	}
	// Open the pidfd first, then check the start time: if the pid was
	// reused in between, the check fails on the new process.
	pidfd, err := unix.PidfdOpen(st.PID, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, errdefs.NotFound("guest process", strconv.Itoa(st.PID))
	}
	if t, err := runtime.ProcStartTime(st.PID); err != nil || t != st.StartTime {
		unix.Close(pidfd)
		return nil, errdefs.NotFound("guest process", strconv.Itoa(st.PID))
	}
	cg, err := r.cfg.Cgroups.Load(cgroupName(id))
	if err != nil {
		unix.Close(pidfd)
		return nil, fmt.Errorf("loading cgroup: %w", err)
	}
	sb := &Sandbox{id: id, st: st, socket: filepath.Join(r.dir(id), "guest.sock"), cg: cg, done: make(chan struct{}), active: closedChan(), limited: closedChan(), sent: closedChan()}
	// Frozen by its daemon's last run, or by that daemon's death in the
	// middle of a freeze: Kill thaws it until a thaw says otherwise.
	sb.mayBeFrozen.Store(true)
	if err := sb.watch(pidfd); err != nil {
		return nil, err
	}
	// A create answers once its guest has its Activate, before the
	// limits are set (activate): a daemon that died in between left that
	// to this one. Limits first, so that nothing runs without them.
	if err := cg.Update(limitsOf(rs.Resources)); err != nil {
		sb.Kill()
		return nil, fmt.Errorf("setting limits: %w", err)
	}
	if !rs.Frozen {
		if err := sb.Thaw(); err != nil {
			sb.Kill()
			return nil, fmt.Errorf("thawing: %w", err)
		}
		// The guest must answer on its socket, or the sandbox is not
		// usable. (A frozen one cannot; its process was checked above.)
		c := guestapi.NewClient(sb.Dial)
		defer c.Close() // nothing kept for later: the manager has its own
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := c.Ping(pctx); err != nil {
			sb.Kill()
			return nil, fmt.Errorf("pinging guest: %w", err)
		}
	}
	if r.cfg.Network != nil && len(st.Net) > 0 {
		if err := r.cfg.Network.Restore(id, st.Net); err != nil {
			// Its network is gone; nothing it had may be given back by
			// mistake, so the sandbox is ended rather than left half-wired.
			sb.Kill()
			return nil, fmt.Errorf("restoring network: %w", err)
		}
	}
	// A daemon that died right after answering may not have raised the
	// guest's priority yet (activate does that after the answer).
	raisePriority(st.PID, cg)
	return sb, nil
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	_, err := r.stopSandbox(ctx, id)
	return err
}

// stopSandbox is Stop; ended reports that it found the sandbox's cgroup and
// removed it, so that every process of the sandbox has ended.
func (r *Runtime) stopSandbox(ctx context.Context, id string) (ended bool, _ error) {
	cg, err := r.cfg.Cgroups.Load(cgroupName(id))
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return false, err
	}
	if cg != nil {
		// Nearly always empty by now: the guest, the pid namespace's
		// init, has died, and the kernel ended the rest with it.
		gone, err := cg.DeleteIfEmpty()
		if err != nil {
			return false, fmt.Errorf("removing cgroup: %w", err)
		}
		if !gone {
			if err := cg.Kill(); err != nil {
				return false, fmt.Errorf("killing sandbox processes: %w", err)
			}
			if err := cg.Delete(ctx); err != nil {
				return false, fmt.Errorf("removing cgroup: %w", err)
			}
		}
	}
	os.Remove(filepath.Join(r.dir(id), "guest.sock"))
	if isContainer(id) {
		return cg != nil, nil // its network is its sandbox's
	}
	if slots, ok := r.cfg.Network.(runtime.NetSlots); ok && cg != nil {
		// Its cgroup is gone, so are its processes: every one of them
		// was in it (the guest, the pid namespace's init, ended the
		// others as it died). Its network slot is reset for another.
		slots.Recycle(id)
	} else if r.cfg.Network != nil {
		// Its address is free once the kernel has deleted its veth pair
		// (with its network namespace, now that the processes are gone).
		r.cfg.Network.Detach(id)
	}
	return cg != nil, nil
}

// Remove implements runtime.Runtime. The sandbox's manager calls it in
// the background, after the removal was answered; it can be called again
// after a failure, and for a sandbox an earlier daemon left.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("remove phases", append([]any{"sandbox", id}, phases...)...) }()
	ended, err := r.stopSandbox(ctx, id)
	if err != nil {
		return err
	}
	mark("stopped")
	// A disk nothing can hold any more (as the network slot above) is
	// recycled: wiped behind the call and made ready for another sandbox.
	removeDisk := r.cfg.Disks.Remove
	if ended {
		removeDisk = r.cfg.Disks.Recycle
	}
	if err := removeDisk(ctx, id); err != nil {
		return fmt.Errorf("removing disk: %w", err)
	}
	mark("disk")
	// Its run dir goes to the next guest (spawnGuest) once nothing of
	// the sandbox runs: its guest held its log open.
	if !ended || !r.runSpares.Give(r.dir(id), emptyRunDir) {
		if err := os.RemoveAll(r.dir(id)); err != nil {
			return fmt.Errorf("removing run dir: %w", err)
		}
	}
	mark("run dir")
	if r.cfg.Network != nil && !isContainer(id) {
		r.cfg.Network.Forget(id)
	}
	mark("network")
	return nil
}

// Snapshot implements runtime.Runtime.
func (r *Runtime) Snapshot(ctx context.Context, id, dst string, pause func() (func(), error)) (runtime.Capture, error) {
	c, err := r.cfg.Disks.Snapshot(ctx, id, dst, pause)
	if err != nil {
		return runtime.Capture{}, err
	}
	v, err := r.cfg.Disks.Open(id)
	if err != nil {
		return runtime.Capture{}, err
	}
	return runtime.Capture{Frozen: c.Frozen, Total: c.Total, Size: v.Size, Allocated: c.Bytes, Shared: c.Reflink}, nil
}

// DiskUsage implements runtime.Runtime.
func (r *Runtime) DiskUsage(id string) (used, size int64, err error) {
	v, err := r.cfg.Disks.Open(id)
	if err != nil {
		return 0, 0, err
	}
	return v.Usage()
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
	// Warm guests of this runtime are sandboxes-to-be, not leftovers.
	seen := map[string]bool{}
	r.mu.Lock()
	for _, p := range r.pools {
		for _, g := range p.ready {
			seen[g.sb.id] = true
		}
	}
	for id := range r.building {
		seen[id] = true
	}
	for _, list := range r.blank {
		for _, g := range list {
			seen[g.sb.id] = true
		}
	}
	r.mu.Unlock()
	var ids []string
	add := func(id string) {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, id := range cgs {
		add(id)
	}
	for _, id := range vols {
		// Disks named warm-<id> are the runtime's own, whatever the
		// state of their guest: New removed the earlier daemon's before
		// the refill started, and every later one is a warm guest's
		// (ready, being made or being discarded). Reported, they were
		// removed from under guests the pool still held (issue 20.7).
		if !strings.HasPrefix(id, warmPrefix) {
			add(id)
		}
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
	r.closing = true
	var ready []*guestProc
	for k, list := range r.blank {
		ready = append(ready, list...)
		r.blank[k] = nil
	}
	for _, p := range r.pools {
		ready = append(ready, p.ready...)
		p.ready = nil
	}
	r.mu.Unlock()
	for _, g := range ready {
		r.discard(g)
	}
	for range forkerCount {
		if f := <-r.forkers; f != nil {
			f.close()
		}
	}
	for range forkerCount {
		r.forkers <- nil // a late fork starts a forker of its own
	}
	return nil
}
