// Package native is paddock's default isolation tier: each sandbox is a
// user, mount, pid, net, ipc, uts and cgroup namespace around the guest as
// PID 1, on an overlayfs root whose writable layer is a size-capped volume,
// bounded by cgroup limits, Docker's capability set and seccomp profile.
package native

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"paddock/api"
	"paddock/internal/cgroup"
	"paddock/internal/errdefs"
	"paddock/internal/guest"
	"paddock/internal/runtime"
	"paddock/internal/storage/disk"
)

// idRange is the number of uids and gids each sandbox maps.
const idRange = 65536

// Config configures the native runtime.
type Config struct {
	// RunDir holds one directory per sandbox: mount points, the guest's
	// control socket and its log.
	RunDir  string
	Cgroups *cgroup.Manager
	Disks   *disk.Pool
	// Seccomp is the compiled filter every sandbox runs under.
	Seccomp []byte
	// Caps is the capability set sandboxes keep.
	Caps []string
	// OutputLimit is the per-process output the guest retains.
	OutputLimit int64
	Logger      *slog.Logger
}

// Runtime is the native tier.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	guestExe *os.File // sealed copy of our binary, exec'd as each guest
	idmap    bool     // the kernel supports idmapped mounts of our layers
}

var _ runtime.Runtime = (*Runtime)(nil)

// New prepares the native runtime.
func New(cfg Config) (*Runtime, error) {
	if err := os.MkdirAll(filepath.Join(cfg.RunDir, "sandboxes"), 0o711); err != nil {
		return nil, fmt.Errorf("creating run dir: %w", err)
	}
	exe, err := sealedSelf()
	if err != nil {
		return nil, fmt.Errorf("sealing guest binary: %w", err)
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger, guestExe: exe, idmap: true}
	return r, nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "native" }

// Idmapped reports whether sandboxes get idmapped host files.
func (r *Runtime) Idmapped() bool { return r.idmap }

// sealedSelf copies the running binary into a sealed memfd. Guests are
// exec'd from it, so /proc/1/exe in a sandbox is this memfd: nothing can
// write it (F_SEAL_WRITE), and the host's binary is never exposed
// (CVE-2019-5736). One copy serves every sandbox.
func sealedSelf() (*os.File, error) {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return nil, err
	}
	defer src.Close()
	fd, err := unix.MemfdCreate("paddock-guest", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "paddock-guest")
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, err
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("sealing memfd: %w", err)
	}
	return f, nil
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.RunDir, "sandboxes", id) }

// state is what Restore needs.
type state struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	UIDBase   uint32 `json:"uid_base"`
	Idmapped  bool   `json:"idmapped"`
}

// Sandbox is a running native sandbox.
type Sandbox struct {
	id     string
	st     state
	socket string
	cg     *cgroup.Group
	done   chan struct{}

	// mu guards pidfd against use after the watcher closed it: a closed
	// fd number may be reused, and a signal must never reach another
	// process.
	mu      sync.Mutex
	pidFile *os.File // nil once the guest has exited
}

var _ runtime.Instance = (*Sandbox)(nil)

// ID implements runtime.Instance.
func (s *Sandbox) ID() string { return s.id }

// State implements runtime.Instance.
func (s *Sandbox) State() []byte { b, _ := json.Marshal(s.st); return b }

// Done implements runtime.Instance.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Dial implements runtime.Instance.
func (s *Sandbox) Dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.socket)
	if err != nil {
		select {
		case <-s.done:
			return nil, errdefs.Conflict("sandbox %s has ended", s.id)
		default:
		}
		return nil, err
	}
	return c, nil
}

// Kill implements runtime.Instance: SIGKILL to the guest ends its pid
// namespace, and the kernel kills every process in it.
func (s *Sandbox) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidFile == nil {
		return nil
	}
	err := unix.PidfdSendSignal(int(s.pidFile.Fd()), unix.SIGKILL, nil, 0)
	if err == unix.ESRCH {
		return nil
	}
	return err
}

// Info implements runtime.Instance.
func (s *Sandbox) Info() api.RuntimeInfo {
	info := api.RuntimeInfo{Name: "native", HostPID: s.st.PID, UIDBase: s.st.UIDBase, Idmapped: s.st.Idmapped}
	if s.cg != nil {
		info.Cgroup = s.cg.Path()
	}
	return info
}

// Cgroup returns the sandbox's cgroup.
func (s *Sandbox) Cgroup() *cgroup.Group { return s.cg }

// watch takes ownership of pidfd and closes done when the guest exits,
// reaping it if it is our child.
func (s *Sandbox) watch(pidfd int) error {
	if err := unix.SetNonblock(pidfd, true); err != nil {
		unix.Close(pidfd)
		return err
	}
	f := os.NewFile(uintptr(pidfd), "pidfd")
	s.pidFile = f
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	exited := func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(fds, 0)
		return n > 0
	}
	go func() {
		// The pidfd turns readable when the process exits; Go's poller
		// waits for that without holding a thread per sandbox.
		if err := rc.Read(exited); err != nil {
			rc.Control(func(fd uintptr) {
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				for {
					if _, err := unix.Poll(fds, -1); err != unix.EINTR {
						return
					}
				}
			})
		}
		s.mu.Lock()
		rc.Control(func(fd uintptr) {
			// Reap it if it is our child; a guest left by an earlier
			// daemon was reparented, and its new parent reaps it.
			var info unix.Siginfo
			unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil)
		})
		f.Close()
		s.pidFile = nil
		s.mu.Unlock()
		close(s.done)
	}()
	return nil
}

// Start implements runtime.Runtime.
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) (_ runtime.Instance, retErr error) {
	var cleanups []func()
	defer func() {
		if retErr != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()
	t0 := time.Now()
	var phases []any
	mark := func(name string) { phases = append(phases, name, time.Since(t0).Round(time.Microsecond).String()) }
	defer func() { r.log.Debug("start phases", append([]any{"sandbox", spec.ID}, phases...)...) }()
	dir := r.dir(spec.ID)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, fmt.Errorf("creating sandbox dir: %w", err)
	}
	for i := range spec.Image.Layers {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprintf("lower%d", i)), 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		return nil, err
	}

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

	mark("cgroup")
	vol, err := r.volume(ctx, spec)
	mark("disk")
	if err != nil {
		return nil, err
	}
	upper, work := filepath.Join(vol.Path, "upper"), filepath.Join(vol.Path, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return nil, err
		}
		if err := os.Lchown(d, int(spec.UIDBase), int(spec.UIDBase)); err != nil {
			return nil, err
		}
	}

	socket := filepath.Join(dir, "guest.sock")
	os.Remove(socket)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on guest socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	lnFile, err := ln.File()
	ln.Close()
	if err != nil {
		return nil, err
	}
	defer lnFile.Close()

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating sync socket: %w", err)
	}
	parentSync := os.NewFile(uintptr(pair[0]), "sync")
	childSync := os.NewFile(uintptr(pair[1]), "sync-child")
	defer parentSync.Close()
	defer childSync.Close()

	logFile, err := os.OpenFile(filepath.Join(dir, "guest.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	oom, err := cg.OpenOOMEvents()
	if err != nil {
		return nil, fmt.Errorf("opening OOM events: %w", err)
	}
	defer oom.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devNull.Close()

	pidfd := -1
	sys := &syscall.SysProcAttr{
		Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
			unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(spec.UIDBase), Size: idRange}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(spec.UIDBase), Size: idRange}},
		GidMappingsEnableSetgroups: true,
		// Our host uid (0) is unmapped in the new namespace: become its
		// root before exec, or exec drops every capability.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		Setsid:     true,
		PidFD:      &pidfd,
	}
	if r.cfg.Cgroups.Mode() == cgroup.V2 {
		cgfd, err := cg.OpenDirFD()
		if err != nil {
			return nil, err
		}
		defer cgfd.Close()
		sys.UseCgroupFD = true
		sys.CgroupFD = int(cgfd.Fd())
	}
	argv := []string{"paddock", "guest"}
	exe := fmt.Sprintf("/proc/self/fd/%d", r.guestExe.Fd())
	pid, err := syscall.ForkExec(exe, argv, &syscall.ProcAttr{
		Env:   []string{},
		Files: []uintptr{devNull.Fd(), logFile.Fd(), logFile.Fd(), childSync.Fd(), lnFile.Fd(), oom.Fd()},
		Sys:   sys,
	})
	if err != nil {
		return nil, fmt.Errorf("starting guest: %w", err)
	}
	mark("forked")
	sb := &Sandbox{id: spec.ID, socket: socket, cg: cg, done: make(chan struct{})}
	sb.st = state{PID: pid, UIDBase: spec.UIDBase}
	if err := sb.watch(pidfd); err != nil {
		unix.Kill(pid, unix.SIGKILL)
		return nil, err
	}
	cleanups = append(cleanups, func() {
		sb.Kill()
		<-sb.done
	})
	childSync.Close()
	if r.cfg.Cgroups.Mode() == cgroup.V1 {
		if err := cg.AddProc(pid); err != nil {
			return nil, fmt.Errorf("moving guest into its cgroup: %w", err)
		}
	}

	cfg := guest.Config{
		ID:       spec.ID,
		Hostname: spec.ID,
		RunDir:   dir,
		Upper:    upper,
		Work:     work,
		CgroupV2: r.cfg.Cgroups.Mode() == cgroup.V2,
		Seccomp:  r.cfg.Seccomp,
		Caps:     r.cfg.Caps,
		Serve: guest.ServeConfig{
			Env:         spec.Env,
			Workdir:     spec.Workdir,
			OutputLimit: r.cfg.OutputLimit,
		},
	}
	fds, idmapped, err := r.mountFDs(pid, spec, &cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	sb.st.Idmapped = idmapped
	if err := sendConfig(parentSync, &cfg, fds); err != nil {
		return nil, err
	}
	mark("config-sent")
	ready, err := waitReady(ctx, parentSync, sb.done)
	if err != nil {
		return nil, fmt.Errorf("starting sandbox: %w%s", err, guestLogTail(filepath.Join(dir, "guest.log")))
	}
	mark("ready")
	if ready.PID != 1 {
		return nil, fmt.Errorf("guest reported pid %d, want 1", ready.PID)
	}
	st, err := procStartTime(pid)
	if err != nil {
		return nil, err
	}
	sb.st.StartTime = st
	return sb, nil
}

func (r *Runtime) volume(ctx context.Context, spec runtime.Spec) (*disk.Volume, error) {
	vol, err := r.cfg.Disks.Open(spec.ID)
	if err == nil {
		return vol, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("opening disk: %w", err)
	}
	vol, err = r.cfg.Disks.Acquire(ctx, spec.ID, spec.Resources.DiskBytes, int(spec.UIDBase), int(spec.UIDBase))
	if err != nil {
		return nil, fmt.Errorf("acquiring disk: %w", err)
	}
	return vol, nil
}

// mountFDs fills cfg's layers and binds. Where the kernel allows, each is
// a detached idmapped mount made here (it takes privilege in the initial
// user namespace) and attached by the guest, so that host files owned by
// root show as root in the sandbox instead of nobody.
func (r *Runtime) mountFDs(pid int, spec runtime.Spec, cfg *guest.Config) (fds []int, idmapped bool, err error) {
	var userns *os.File
	if r.idmap {
		userns, err = os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
		if err != nil {
			return nil, false, fmt.Errorf("opening sandbox user namespace: %w", err)
		}
		defer userns.Close()
	}
	add := func(src string) guest.Mount {
		if userns == nil {
			return guest.Mount{Source: src, FD: -1}
		}
		fd, err := idmappedTree(src, int(userns.Fd()))
		if err != nil {
			r.log.Warn("idmapped mounts unavailable; host files will show as nobody", "path", src, "err", err)
			r.idmap = false
			userns = nil
			return guest.Mount{Source: src, FD: -1}
		}
		fds = append(fds, fd)
		return guest.Mount{Source: src, FD: len(fds) - 1}
	}
	for _, l := range spec.Image.Layers {
		cfg.Layers = append(cfg.Layers, add(l))
	}
	for _, b := range spec.Image.Binds {
		m := add(b.Source)
		m.Dest = b.Dest
		cfg.Binds = append(cfg.Binds, m)
	}
	idmapped = len(fds) > 0 && len(fds) == len(cfg.Layers)+len(cfg.Binds)
	if !idmapped {
		// All or nothing: a half-idmapped rootfs has inconsistent owners.
		for _, fd := range fds {
			unix.Close(fd)
		}
		fds = nil
		for i := range cfg.Layers {
			cfg.Layers[i].FD = -1
		}
		for i := range cfg.Binds {
			cfg.Binds[i].FD = -1
		}
	}
	return fds, idmapped, nil
}

// idmappedTree clones the mount tree at path as a detached, read-only
// mount whose owners are mapped through the user namespace usernsFD.
func idmappedTree(path string, usernsFD int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID,
		Userns_fd: uint64(usernsFD),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr %s: %w", path, err)
	}
	return fd, nil
}

func sendConfig(sock *os.File, cfg *guest.Config, fds []int) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(int(sock.Fd()), b, oob, nil, 0); err != nil {
		return fmt.Errorf("sending guest config: %w", err)
	}
	return nil
}

// waitReady waits for the guest's ready (or failure) message.
func waitReady(ctx context.Context, sock *os.File, done <-chan struct{}) (*guest.Ready, error) {
	type result struct {
		r   guest.Ready
		err error
	}
	ch := make(chan result, 1)
	go func() {
		buf := make([]byte, 64<<10)
		n, err := sock.Read(buf)
		if err != nil || n == 0 {
			ch <- result{err: fmt.Errorf("guest exited before it was ready")}
			return
		}
		var rd guest.Ready
		if err := json.Unmarshal(buf[:n], &rd); err != nil {
			ch <- result{err: fmt.Errorf("decoding guest ready: %w", err)}
			return
		}
		if rd.Error != "" {
			ch <- result{err: errors.New(rd.Error)}
			return
		}
		ch <- result{r: rd}
	}()
	select {
	case res := <-ch:
		return &res.r, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("guest not ready after 30s")
	}
}

func guestLogTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return " (guest log: " + strings.TrimSpace(string(b)) + ")"
}

// procStartTime reads a process's start time (clock ticks since boot), which
// with the pid identifies it across pid reuse.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may contain spaces and parentheses: fields start
	// after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("parsing /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
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
	seen := map[string]bool{}
	cgs, err := r.cfg.Cgroups.List()
	if err != nil {
		return nil, err
	}
	vols, err := r.cfg.Disks.List()
	if err != nil {
		return nil, err
	}
	entries, _ := os.ReadDir(filepath.Join(r.cfg.RunDir, "sandboxes"))
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
		add(id)
	}
	for _, e := range entries {
		add(e.Name())
	}
	return ids, nil
}
