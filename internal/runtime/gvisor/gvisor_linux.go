package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/storage/disk"
)

// Name is the tier's name (api.CreateRequest.Runtime).
const Name = "gvisor"

// Config configures the gvisor runtime.
type Config struct {
	// Runsc is the runsc binary (scripts/runsc-bin.sh builds it).
	Runsc string
	// RunDir is the daemon's run dir: each sandbox's bundle, root mount
	// point, control socket and logs go in RunDir/sandboxes/<id> (as the
	// native tier's do), runsc's own state in RunDir/gvisor.
	RunDir  string
	Cgroups *cgroup.Manager
	Disks   *disk.Pool
	IDs     runtime.IDs
	// Caps is the capability set the sandbox's processes keep (the guest
	// drops to it before it forks any).
	Caps []string
	// Seccomp is the compiled filter the sandbox's processes run under
	// (the native tier's: Docker's profile), in gVisor's kernel: the
	// guest loads it on the thread it forks them from.
	Seccomp []byte
	// OutputLimit is the per-process output the guest retains.
	OutputLimit int64
	// GuestBinary is a static binary with the guest verb; empty means the
	// slim guest this build embeds, or else this process's own binary.
	GuestBinary string
	// Network wires each sandbox's network namespace; nil leaves
	// sandboxes with loopback only.
	Network runtime.Network
	// Base is the native tier, whose disks, run dirs and network state
	// a gvisor sandbox's are: it snapshots, measures and removes them.
	Base   runtime.Runtime
	Logger *slog.Logger
}

// Runtime is the gvisor tier.
type Runtime struct {
	cfg     Config
	log     *slog.Logger
	root    string // runsc --root
	guest   string // the guest binary new sandboxes bind (guest_linux.go)
	version string // runsc's, as `runsc --version` says
	pool    *pool  // nil until KeepReady

	mu        sync.Mutex
	squeezers map[string]*squeezer // checkpoints being compressed, by sandbox
	live      map[string]*Sandbox  // watched sandboxes, by id, until they end
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Owner   = (*Runtime)(nil)
	_ runtime.Keeper  = (*Runtime)(nil)
)

// New checks runsc and readies the runtime's directories.
func New(cfg Config) (*Runtime, error) {
	if cfg.Runsc == "" {
		return nil, fmt.Errorf("%w: no runsc binary (make runsc builds one)", errdefs.ErrUnavailable)
	}
	out, err := exec.Command(cfg.Runsc, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("running %s --version: %w", cfg.Runsc, err)
	}
	version, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	r := &Runtime{
		cfg:       cfg,
		log:       cfg.Logger,
		root:      filepath.Join(cfg.RunDir, "gvisor"),
		version:   strings.TrimPrefix(version, "runsc version "),
		squeezers: map[string]*squeezer{},
		live:      map[string]*Sandbox{},
	}
	if err := os.MkdirAll(filepath.Join(cfg.RunDir, "sandboxes"), 0o711); err != nil {
		return nil, fmt.Errorf("creating run dir: %w", err)
	}
	if err := os.MkdirAll(r.guests(), 0o700); err != nil {
		return nil, fmt.Errorf("creating runsc root: %w", err)
	}
	if r.guest, err = writeGuest(r.guests(), cfg.GuestBinary); err != nil {
		return nil, fmt.Errorf("writing guest binary: %w", err)
	}
	r.pruneGuests(r.guest)
	return r, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

// Version is runsc's version.
func (r *Runtime) Version() string { return r.version }

// Owns implements runtime.Owner: a sandbox is this tier's while its
// bundle is in its run dir (from its start to its removal).
func (r *Runtime) Owns(id string) bool {
	_, err := os.Stat(filepath.Join(r.dir(id), "config.json"))
	return err == nil
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.RunDir, "sandboxes", id) }

// runsc runs runsc with the runtime's global flags and args.
func (r *Runtime) runsc(ctx context.Context, args ...string) *exec.Cmd {
	global := []string{
		"--root", r.root,
		"--platform", "systrap",
		// The sandbox's writes go to its disk, not to gVisor's own
		// memory-backed overlay.
		"--overlay2", "none",
		// The guest binds its control socket in a host directory.
		"--host-uds", "create",
	}
	if r.cfg.Network == nil {
		// Loopback only: gVisor's netstack brings up no interface of a
		// fresh namespace, whose lo is down, so without this a sandbox
		// has not even 127.0.0.1.
		global = append(global, "--network", "none")
	}
	return exec.CommandContext(ctx, r.cfg.Runsc, append(global, args...)...)
}

// Start implements runtime.Runtime: a sandbox the pool serves (pool.go)
// is handed out; any other is built now: the sandbox's root is overlaid
// on the host (image layers under its disk's upper dir), runsc starts the
// guest from an OCI bundle of it in the sandbox's cgroup and network
// slot, and the guest is sent its Prepare. Then the guest is sent its
// Activate (the environment). Start returns once the guest serves.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (_ runtime.Instance, retErr error) {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	picked := spec.ID == ""
	rd := r.take(spec)
	if rd != nil {
		mark("taken")
		if err := rd.sb.Update(spec.Resources); err != nil {
			r.discard(rd)
			return nil, fmt.Errorf("setting limits: %w", err)
		}
	} else if spec.FromCheckpoint || spec.CheckpointFrom != "" {
		if picked {
			spec.ID = runtime.NewID()
		}
		var err error
		if rd, err = r.resume(ctx, spec, mark); err != nil {
			if picked && r.cfg.Network != nil {
				r.cfg.Network.Forget(spec.ID)
			}
			return nil, err
		}
		mark("restored")
		r.log.Debug("gvisor start phases", append([]any{"sandbox", rd.sb.id}, phases...)...)
		return rd.sb, nil
	} else {
		if picked {
			spec.ID = runtime.NewID()
		}
		var err error
		if rd, err = r.build(ctx, spec.ID, spec, false, mark); err != nil {
			if picked && r.cfg.Network != nil {
				r.cfg.Network.Forget(spec.ID)
			}
			return nil, err
		}
	}
	defer func() { r.log.Debug("gvisor start phases", append([]any{"sandbox", rd.sb.id}, phases...)...) }()
	if err := r.activate(ctx, rd, spec); err != nil {
		if picked || rd.pooled {
			r.discard(rd)
		} else {
			rd.undo()
		}
		return nil, err
	}
	mark("ready")
	return rd.sb, nil
}

// prepared is a sandbox whose guest runs under runsc, prepared but not
// activated: made by a cold start, or ahead of time by the pool.
type prepared struct {
	sb     *Sandbox
	sync   *os.File // the guest's sync socket, until activated
	net    runtime.NetSetup
	pooled bool
	// undo removes what build made (not a disk that was there before).
	undo func()
}

// build makes sandbox id up to its guest's Prepare; ahead (the pool's)
// has the guest run one command through its exec path while nobody
// waits, so that the sentry has the loader and libc cached for the first
// command of the create that takes it. On failure nothing of it is left
// but a disk that existed before.
func (r *Runtime) build(ctx context.Context, id string, spec runtime.Spec, ahead bool, mark func(string)) (_ *prepared, retErr error) {
	// A pause's squeezer may still end the sandbox's last stop.
	r.stopSqueezing(id)
	var cleanups []func()
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
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) {
			return nil, errdefs.Invalid("mount", "%s is not absolute", m.Source)
		}
	}
	uidBase := spec.UIDBase
	if uidBase == 0 {
		base, err := r.cfg.IDs.Alloc()
		if err != nil {
			return nil, err
		}
		uidBase = base
		cleanups = append(cleanups, func() { r.cfg.IDs.Free(base) })
	}
	cg, err := r.cfg.Cgroups.Create(id, limitsOf(spec.Resources))
	if err != nil {
		return nil, fmt.Errorf("creating cgroup: %w", err)
	}
	cleanups = append(cleanups, func() {
		cg.Kill()
		cg.Delete(context.Background())
	})
	dir := r.dir(id)
	if err := os.MkdirAll(filepath.Join(dir, "ctl"), 0o700); err != nil {
		return nil, fmt.Errorf("creating run dir: %w", err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(dir) })
	mark("cgroup")

	// The network slot: a namespace made and wired ahead, which runsc's
	// netstack takes over.
	var netns runtime.NetNS
	var net runtime.NetSetup
	if r.cfg.Network != nil {
		slots, ok := r.cfg.Network.(runtime.NetSlots)
		if !ok {
			return nil, fmt.Errorf("%w: the gvisor runtime needs network slots", errdefs.ErrUnavailable)
		}
		if netns, err = slots.TakeNetns(); err != nil {
			return nil, fmt.Errorf("taking a network slot: %w", err)
		}
		cleanups = append(cleanups, netns.Close)
		if net, err = r.cfg.Network.Attach(id, netns.FD()); err != nil {
			return nil, fmt.Errorf("wiring network: %w", err)
		}
		cleanups = append(cleanups, func() { r.cfg.Network.Detach(id) })
		mark("net")
	}

	v, fresh, err := r.disk(ctx, id, spec)
	if err != nil {
		return nil, fmt.Errorf("getting disk: %w", err)
	}
	if fresh {
		cleanups = append(cleanups, func() { r.cfg.Disks.Remove(context.Background(), id) })
	}
	mark("disk")
	rootfs := filepath.Join(dir, "rootfs")
	if err := mountRoot(rootfs, spec.Image.Layers, v.Path); err != nil {
		return nil, err
	}
	cleanups = append(cleanups, func() { unmountRoot(rootfs) })
	mark("root")

	// A resume with memory restores the checkpoint on the disk, a
	// sandbox made from a memory snapshot the snapshot's (resume), each
	// with the guest binary it was taken with; anything else runs this
	// daemon's guest afresh.
	image := filepath.Join(v.Path, checkpointName)
	if spec.CheckpointFrom != "" {
		image = spec.CheckpointFrom
	}
	restoring := spec.FromCheckpoint || spec.CheckpointFrom != ""
	guest := r.guest
	if restoring {
		if guest, err = r.checkpointGuest(image); err != nil {
			return nil, err
		}
	}
	netnsPath := ""
	if netns != nil {
		netnsPath = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), netns.FD())
	}
	var tmp string
	if restoring {
		tmp, err = restoredTmp(image, rootfs)
	} else {
		tmp, err = rootTmp(rootfs)
	}
	if err != nil {
		return nil, err
	}
	oci := bundleSpec(bundle{
		id: id, rootfs: rootfs, guest: guest, ctl: filepath.Join(dir, "ctl"),
		image: spec.Image, net: net, mounts: spec.Mounts, netns: netnsPath, cgroup: cg.Path(), tmp: tmp,
	})
	b, err := json.MarshalIndent(oci, "", "\t")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		return nil, fmt.Errorf("writing bundle: %w", err)
	}

	var sb *Sandbox
	var sync *os.File
	if restoring {
		sb, err = r.restoreRun(ctx, id, dir, image, filepath.Join(v.Path, checkpointName+".open"))
	} else {
		sb, sync, err = r.run(ctx, id, dir, cg)
	}
	if err != nil {
		r.runsc(context.Background(), "delete", "--force", id).Run()
		pruneCgroupParents(cg)
		return nil, err
	}
	cleanups = append(cleanups, func() {
		if sync != nil {
			sync.Close()
		}
		sb.Kill()
		r.runsc(context.Background(), "delete", "--force", id).Run()
		pruneCgroupParents(cg)
	})
	sb.st.UIDBase = uidBase
	sb.st.Net = net.State
	mark("runsc")
	if restoring {
		if err := r.relisten(ctx, id); err != nil {
			return nil, fmt.Errorf("%w: %v%s", runtime.ErrCheckpointUnusable, err, guestapi.LogTail(filepath.Join(dir, "guest.log")))
		}
		mark("relistened")
		if spec.FromCheckpoint {
			// The processes run on from here: the checkpoint is spent.
			os.RemoveAll(image)
		}
		return &prepared{sb: sb, net: net, undo: undo}, nil
	}

	oom, err := cg.OpenOOMEvents()
	if err != nil {
		return nil, fmt.Errorf("opening OOM events: %w", err)
	}
	defer oom.Close()
	p := &guestapi.Prepare{
		RootReady:   true,
		Listen:      guestSocket,
		Caps:        r.cfg.Caps,
		Seccomp:     r.cfg.Seccomp,
		AllowSetuid: spec.Image.AllowSetuid,
		SkipWarmUp:  !ahead,
		OOMFD:       0,
		Hostname:    id,
	}
	if err := guestapi.SendConfig(sync, &guestapi.Config{Prepare: p}, []int{int(oom.Fd())}); err != nil {
		return nil, err
	}
	if _, err := guestapi.WaitReady(ctx, sync, sb.done); err != nil {
		return nil, fmt.Errorf("preparing guest: %w%s", err, guestapi.LogTail(filepath.Join(dir, "guest.log")))
	}
	mark("prepared")
	return &prepared{sb: sb, sync: sync, net: net, undo: undo}, nil
}

// resume restores sandbox spec.ID from its memory checkpoint, or a new
// sandbox from a memory snapshot's (spec.CheckpointFrom). Its policy is
// set first (spec.Setup, which a fresh start calls on activation), so
// that it holds before the restored processes run on: a daemon restarted
// since the pause knows none, and a copy's id is new. New processes then
// get the variables of the sandbox's network slot (a new one: the
// proxy's address) and its policy's (secret placeholders), and a copy its
// own environment (spec.Env) over the snapshot's; the running ones keep
// theirs, which the gateway still serves (its originalDst).
func (r *Runtime) resume(ctx context.Context, spec runtime.Spec, mark func(string)) (*prepared, error) {
	var env []string
	if spec.Setup != nil {
		more, err := spec.Setup(spec.ID)
		if err != nil {
			return nil, err
		}
		env = more
	}
	rd, err := r.build(ctx, spec.ID, spec, false, mark)
	if err != nil {
		return nil, err
	}
	env = append(append([]string(nil), rd.net.Env...), env...)
	if spec.CheckpointFrom != "" {
		env = append(append([]string(nil), spec.Env...), env...)
	}
	if len(env) > 0 {
		c := guestapi.NewClient(rd.sb.Dial)
		err := c.SetEnv(ctx, env)
		c.Close()
		if err != nil {
			rd.undo()
			return nil, fmt.Errorf("giving the guest its network's variables: %w", err)
		}
	}
	return rd, nil
}

// activate gives a prepared sandbox its environment and waits for its
// guest to serve.
func (r *Runtime) activate(ctx context.Context, rd *prepared, spec runtime.Spec) error {
	defer rd.sync.Close()
	env := append(append([]string(nil), spec.Env...), rd.net.Env...)
	if spec.Setup != nil {
		more, err := spec.Setup(rd.sb.id)
		if err != nil {
			return err
		}
		env = append(env, more...)
	}
	act := &guestapi.Activate{Serve: guestapi.ServeConfig{
		Env:         env,
		Workdir:     spec.Workdir,
		OutputLimit: r.cfg.OutputLimit,
	}}
	if err := guestapi.SendConfig(rd.sync, &guestapi.Config{Activate: act}, nil); err != nil {
		return err
	}
	ready, err := guestapi.WaitReady(ctx, rd.sync, rd.sb.done)
	if err != nil {
		return fmt.Errorf("starting guest: %w%s", err, guestapi.LogTail(filepath.Join(r.dir(rd.sb.id), "guest.log")))
	}
	if ready.PID != 1 {
		return fmt.Errorf("guest reported pid %d, want 1", ready.PID)
	}
	return nil
}

// guestSocket is where the guest binds its control socket in the
// sandbox: the host's RunDir/sandboxes/<id>/ctl, bound at /dev/.paddock,
// which the guest covers once bound.
const (
	guestDir    = "/dev/.paddock"
	guestSocket = guestDir + "/guest.sock"
	guestExe    = "/dev/.paddock-guest"
)

// disk opens sandbox id's disk, or makes it (from spec.DiskFrom, or
// empty); fresh says it was made now.
func (r *Runtime) disk(ctx context.Context, id string, spec runtime.Spec) (*disk.Volume, bool, error) {
	v, err := r.cfg.Disks.Open(id)
	fresh := false
	if errors.Is(err, errdefs.ErrNotFound) {
		if spec.DiskFrom != "" {
			v, err = r.cfg.Disks.AcquireFrom(ctx, id, spec.DiskFrom, 0, 0)
		} else {
			v, err = r.cfg.Disks.Acquire(ctx, id, spec.Resources.DiskBytes, 0, 0)
		}
		fresh = err == nil
	}
	if err != nil {
		return nil, false, err
	}
	// Owners on the disk are the sandbox's own (root is 0), as on a
	// native sandbox's idmapped disk: gVisor maps no ids on the host.
	for _, d := range []string{"upper", "work"} {
		p := filepath.Join(v.Path, d)
		if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
			return nil, false, err
		}
	}
	return v, fresh, nil
}

// mountRoot overlays layers (top-most first) under the disk's upper dir
// at target.
func mountRoot(target string, layers []string, diskPath string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,xino=off",
		strings.Join(layers, ":"), filepath.Join(diskPath, "upper"), filepath.Join(diskPath, "work"))
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mounting the sandbox's root: %w", err)
	}
	return nil
}

func unmountRoot(target string) {
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return
	}
	os.Remove(target)
}

// run starts runsc on the bundle in dir, in cgroup cg, and returns the
// sandbox (watching the sentry's process) and the daemon's end of the
// guest's sync socket.
func (r *Runtime) run(ctx context.Context, id, dir string, cg *cgroup.Group) (*Sandbox, *os.File, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("creating sync socket: %w", err)
	}
	parent := os.NewFile(uintptr(pair[0]), "sync")
	child := os.NewFile(uintptr(pair[1]), "sync-child")
	defer child.Close()
	logFile, err := os.OpenFile(filepath.Join(dir, "guest.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		parent.Close()
		return nil, nil, err
	}
	defer logFile.Close()
	pidFile := filepath.Join(dir, "sentry.pid")
	cmd := r.runsc(ctx, "--log", filepath.Join(dir, "runsc.log"), "run", "--detach",
		"--bundle", dir, "--pid-file", pidFile, "--pass-fd", "3:3", id)
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Run(); err != nil {
		parent.Close()
		return nil, nil, fmt.Errorf("runsc run: %v%s", err, guestapi.LogTail(logFile.Name()))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		parent.Close()
		return nil, nil, fmt.Errorf("reading the sandbox's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		parent.Close()
		return nil, nil, fmt.Errorf("reading the sandbox's pid: %w", err)
	}
	sb, err := r.watch(id, pid, cg)
	if err != nil {
		parent.Close()
		return nil, nil, err
	}
	return sb, parent, nil
}

// watch makes the Sandbox of runsc sandbox process pid; for a sandbox
// whose sentry is being replaced (renew: restoreRun of its own
// checkpoint), pid is its new sentry, and its Sandbox is returned.
func (r *Runtime) watch(id string, pid int, cg *cgroup.Group) (*Sandbox, error) {
	r.mu.Lock()
	sb := r.live[id]
	r.mu.Unlock()
	if sb != nil && sb.awaiting() {
		return sb, sb.arrive(pid)
	}
	sb = &Sandbox{
		id:      id,
		socket:  filepath.Join(r.dir(id), "ctl", "guest.sock"),
		cg:      cg,
		done:    make(chan struct{}),
		version: r.version,
	}
	if err := sb.arrive(pid); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.live[id] = sb
	r.mu.Unlock()
	sb.OnExit(func() {
		r.mu.Lock()
		if r.live[id] == sb {
			delete(r.live, id)
		}
		r.mu.Unlock()
	})
	return sb, nil
}

// Restore implements runtime.Runtime.
func (r *Runtime) Restore(ctx context.Context, id string, rs runtime.RestoreSpec) (runtime.Instance, error) {
	var st state
	if err := json.Unmarshal(rs.State, &st); err != nil {
		return nil, fmt.Errorf("decoding state: %w", err)
	}
	cg, err := r.cfg.Cgroups.Load(id)
	if err != nil {
		return nil, fmt.Errorf("loading cgroup: %w", err)
	}
	sb, err := r.watch(id, st.PID, cg)
	if err != nil {
		return nil, err
	}
	if sb.st.StartTime != st.StartTime {
		sb.stopWatching()
		return nil, errdefs.NotFound("sandbox process", strconv.Itoa(st.PID))
	}
	sb.st = st
	if err := cg.Update(limitsOf(rs.Resources)); err != nil {
		sb.Kill()
		return nil, fmt.Errorf("setting limits: %w", err)
	}
	if !rs.Frozen {
		if err := sb.Thaw(); err != nil {
			sb.Kill()
			return nil, fmt.Errorf("thawing: %w", err)
		}
		c := guestapi.NewClient(sb.Dial)
		defer c.Close()
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := c.Ping(pctx); err != nil {
			sb.Kill()
			return nil, fmt.Errorf("pinging guest: %w", err)
		}
	}
	if r.cfg.Network != nil && len(st.Net) > 0 {
		if err := r.cfg.Network.Restore(id, st.Net); err != nil {
			sb.Kill()
			return nil, fmt.Errorf("restoring network: %w", err)
		}
	}
	return sb, nil
}

// Stop implements runtime.Runtime: the sandbox's processes (the sentry
// and its gofer: all of them are in its cgroup) are killed, runsc's
// record of it deleted and its root unmounted; then the base tier removes
// the cgroup. Its disk and bundle stay. A sandbox Checkpoint left
// stopped (paused), whose sentry the caller has killed, is not waited
// for: its checkpoint's squeezer ends its stop behind the pause's answer
// (finishStop, then the root's unmount after the squeeze).
func (r *Runtime) Stop(ctx context.Context, id string) error {
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("gvisor stop phases", append([]any{"sandbox", id}, phases...)...) }()
	cg, err := r.cfg.Cgroups.Load(id)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	mark("loaded")
	handed := r.handOver(id, func() { r.finishStop(id, cg) })
	if handed {
		mark("handed over")
	} else {
		if cg != nil {
			if err := cg.Kill(); err != nil {
				return fmt.Errorf("killing sandbox processes: %w", err)
			}
		}
		mark("killed")
		r.deleteRecord(id, cg)
		unmountRoot(filepath.Join(r.dir(id), "rootfs"))
		mark("unmounted")
	}
	os.Remove(filepath.Join(r.dir(id), "ctl", "guest.sock"))
	mark("socket removed")
	if r.cfg.Network != nil {
		// runsc's netstack took the slot's interface over (and its
		// address off the kernel's side): the slot is destroyed, not
		// reset for another sandbox (the base tier's Stop finds it
		// detached).
		r.cfg.Network.Detach(id)
	}
	mark("detached")
	if handed {
		return nil
	}
	defer mark("base")
	return r.cfg.Base.Stop(ctx, id)
}

// finishStop is the rest of the stop of sandbox id (its cgroup cg, if
// it has one) after a checkpoint, which its squeezer runs: its
// processes, stopped and signalled, exit (the kernel frees the memory
// they held: most of a second for 512 MiB on a busy host), whatever is
// left is killed, runsc's record of it is deleted and the base tier
// removes its cgroup.
func (r *Runtime) finishStop(id string, cg *cgroup.Group) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if cg != nil {
		// Killing a group whose processes are exiting freezes it
		// first (cgroup v1): wait for them.
		for {
			pids, err := cg.Pids()
			if err != nil || len(pids) == 0 || ctx.Err() != nil {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := cg.Kill(); err != nil {
			r.log.Warn("ending a paused sandbox's processes", "sandbox", id, "err", err)
		}
	}
	r.deleteRecord(id, cg)
	if err := r.cfg.Base.Stop(ctx, id); err != nil {
		r.log.Warn("ending a paused sandbox's stop", "sandbox", id, "err", err)
	}
}

// deleteRecord deletes runsc's record of stopped sandbox id (runsc keeps
// one under its root until deleted), which removes the cgroups runsc
// made in the controllers the daemon does not use; then their parents
// (cg's, if known) go once empty.
func (r *Runtime) deleteRecord(id string, cg *cgroup.Group) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.runsc(ctx, "delete", "--force", id).Run()
	if cg != nil {
		pruneCgroupParents(cg)
	}
}

// Remove implements runtime.Runtime: what is gVisor's goes, then what
// the two tiers share (disk, run dir, network) the base tier's way.
func (r *Runtime) Remove(ctx context.Context, id string) error {
	r.stopSqueezing(id)
	if err := r.Stop(ctx, id); err != nil {
		return err
	}
	return r.cfg.Base.Remove(ctx, id)
}

// Snapshot implements runtime.Runtime: the disk is captured as the
// base tier's is, the sandbox's processes (the sentry's) frozen by
// pause.
func (r *Runtime) Snapshot(ctx context.Context, id, dst string, pause func() (func(), error)) (runtime.Capture, error) {
	return r.cfg.Base.Snapshot(ctx, id, dst, pause)
}

// DiskUsage implements runtime.Runtime.
func (r *Runtime) DiskUsage(id string) (used, size int64, err error) {
	return r.cfg.Base.DiskUsage(id)
}

// Leftovers implements runtime.Runtime: a gvisor sandbox's host resources
// (cgroup, disk, run dir) are those the native tier lists too; the
// caller's Remove of one reaches this tier while its bundle is there.
func (r *Runtime) Leftovers() ([]string, error) { return nil, nil }

// Close implements runtime.Runtime: sandboxes keep running. runsc pins
// an empty network namespace for its gofers under its root (null-netns,
// bind-mounted, possibly more than once); it goes with the daemon, and
// the next runsc run pins it again.
func (r *Runtime) Close() error {
	r.closePool()
	r.stopAllSqueezing()
	for unix.Unmount(filepath.Join(r.root, "null-netns"), unix.MNT_DETACH) == nil {
	}
	return nil
}

// pruneCgroupParents removes the parents runsc made for cg in the
// controllers the daemon does not use (cpuset, blkio, devices, ...), once
// empty: runsc deletes the sandbox's own cgroups there, not their parent.
func pruneCgroupParents(cg *cgroup.Group) {
	ours := map[string]bool{}
	for _, d := range cg.Dirs() {
		ours[filepath.Dir(d)] = true
	}
	parent := filepath.Dir(cg.Path())
	if parent == "/" || parent == "." {
		return
	}
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	for _, d := range dirs {
		if !ours[d] {
			unix.Rmdir(d) // fails while another sandbox is in it
		}
	}
}

// RemoveCgroups removes what runsc made under the daemon's cgroup parent
// in the controllers the daemon does not use, for an uninstall: its
// sandboxes are gone by then, so the directories are empty.
func RemoveCgroups(parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", strings.Trim(parent, "/")))
	for _, d := range dirs {
		subs, _ := os.ReadDir(d)
		for _, e := range subs {
			if e.IsDir() {
				unix.Rmdir(filepath.Join(d, e.Name()))
			}
		}
		unix.Rmdir(d)
	}
}

func limitsOf(res api.Resources) cgroup.Limits {
	return cgroup.Limits{CPUs: res.CPUs, MemoryBytes: res.MemoryBytes, Pids: res.Pids}
}
