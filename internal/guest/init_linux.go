package guest

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/exitprog"
	"github.com/paddock-dev/paddock/internal/guestapi"
	seccompload "github.com/paddock-dev/paddock/internal/seccomp/load"
	"github.com/paddock-dev/paddock/internal/sysmon"
	"github.com/paddock-dev/paddock/wire"
)

// maskedPaths and readonlyPaths are runc's (and Docker's) defaults: kernel
// interfaces that leak host information or let root in a user namespace
// poke the host kernel.
var maskedPaths = []string{
	"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore",
	"/proc/keys", "/proc/latency_stats", "/proc/timer_list",
	"/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/sys/firmware", "/sys/devices/virtual/powercap",
}

var readonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// Run is the guest (`paddock guest`): PID 1 of a sandbox. The daemon
// starts it in the sandbox's fresh namespaces and cgroup, usually ahead of
// time. Prepare builds the sandbox: the root filesystem, the cgroup
// namespace, the hostname, and the bounds on the guest and everything it
// will fork (no_new_privs, Docker's capability set, the seccomp filter).
// Activate hands it the sandbox's environment and starts serving. It
// returns only on failure, after telling the daemon why.
func Run() error {
	// Mount and cgroup-namespace work is done from this thread.
	runtime.LockOSThread()
	// The guest's work is system calls (pipes, sockets, files), which run
	// in parallel with one P as with more; a second P only makes the
	// runtime wake an idle vCPU for every goroutine another one readies,
	// which on a virtual machine costs 40-100 µs each. One P made the
	// exec round trip 50-90 µs faster; streaming and files throughput
	// did not drop (docs/exec.md). The cost: Go code that runs
	// long (a big tar's headers, a deep listing) shares the one P, which
	// the runtime passes on at least every 10 ms.
	runtime.GOMAXPROCS(1)
	// Best effort: without it the guest is only slower.
	_ = sysmon.Settle()
	// Nothing in the sandbox may ptrace us, read our memory or fds, or
	// open /proc/1/exe.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("setting non-dumpable: %w", err)
	}
	for _, fd := range []int{fdSync, fdListen} {
		syscall.CloseOnExec(fd)
	}
	sp := startSpawner()
	sigs := notifySignals()
	prefault()
	syncSock := os.NewFile(fdSync, "sync")
	fail := func(err error) error {
		guestapi.SendReady(syncSock, guestapi.FailReady(err))
		return err
	}
	var oom *os.File
	// ctl is the control socket: inherited (fd 4), or bound at
	// Prepare.Listen once prepared, so that the daemon can dial it
	// before the guest serves (it accepts once activated).
	var ctl *control
	for {
		cfg, fds, err := guestapi.ReceiveConfig(syncSock)
		if err != nil {
			return fail(err)
		}
		if cfg.Prepare != nil {
			if oom != nil {
				closeAll(fds)
				return fail(errors.New("guest is already prepared"))
			}
			if oom, ctl, err = prepare(cfg.Prepare, fds, sp); err != nil {
				return fail(err)
			}
		} else {
			closeAll(fds)
		}
		if cfg.Activate == nil {
			guestapi.SendReady(syncSock, guestapi.Ready{Phase: guestapi.PhasePrepared})
			continue
		}
		if oom == nil {
			return fail(errors.New("activate before prepare"))
		}
		serveCfg := cfg.Activate.Serve
		if h, err := os.Hostname(); err == nil && !hasKey(serveCfg.Env, "HOSTNAME") {
			serveCfg.Env = append(serveCfg.Env, "HOSTNAME="+h)
		}
		// The working directory exists, as Docker makes it.
		if wd := serveCfg.Workdir; wd != "" {
			if err := os.MkdirAll(wd, 0o755); err != nil {
				return fail(fmt.Errorf("creating workdir %s: %w", wd, err))
			}
		}
		if ctl == nil {
			if ctl, err = controlListener(""); err != nil {
				return fail(err)
			}
		}
		return serve(serveCfg, sp, sigs, syncSock, oom, ctl)
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// prepare builds the sandbox and bounds the guest. It consumes fds and
// returns the cgroup's OOM counter file and, with p.Listen, the control
// socket.
func prepare(p *guestapi.Prepare, fds []int, sp *spawner) (_ *os.File, ctl *control, err error) {
	if p.OOMFD < 0 || p.OOMFD >= len(fds) {
		closeAll(fds)
		return nil, nil, fmt.Errorf("OOM counter fd %d not received", p.OOMFD)
	}
	oom := os.NewFile(uintptr(fds[p.OOMFD]), "oom")
	pidsTasks := -1
	if p.PidsTasks != nil {
		if i := *p.PidsTasks; i >= 0 && i < len(fds) && i != p.OOMFD {
			pidsTasks = fds[i]
		} else {
			closeAll(fds)
			return nil, nil, fmt.Errorf("pids tasks fd %d not received", i)
		}
	} else {
		// Our threads count against the sandbox's pids limit.
		spareThreads(8)
	}
	if !p.RootReady {
		err = buildRoot(p, fds)
	}
	for i, fd := range fds {
		if i != p.OOMFD && fd != pidsTasks {
			unix.Close(fd)
		}
	}
	if err == nil && !p.RootReady {
		err = identify(p)
	} else if err == nil {
		// runsc set the hostname; the files that name it are the image's.
		err = writeIdentity(p.Hostname)
	}
	if err == nil {
		// Under gVisor the guest keeps the sandbox's cgroup namespace:
		// runsc gave it one.
		err = sp.restrict(p.Caps, !p.AllowSetuid, !p.RootReady, pidsTasks)
	}
	if pidsTasks >= 0 {
		unix.Close(pidsTasks)
	}
	if err == nil && p.Listen != "" {
		// Bound and covered before the filter loads: the profile refuses
		// the mount that covers it.
		ctl, err = controlListener(p.Listen)
	}
	if err == nil {
		err = restrictAll(p.Seccomp, !p.AllowSetuid)
	}
	if err == nil && !p.SkipWarmUp {
		// Run one command through the whole exec path while nobody waits
		// on it: its code, memory and the loader's files are then warm for
		// the sandbox's first command.
		err = warmUp(sp)
	}
	if err != nil {
		// The guest ends on this error: a control socket bound goes
		// with it.
		oom.Close()
		return nil, nil, err
	}
	return oom, ctl, nil
}

// identify gives the guest its cgroup namespace (rooted at the sandbox's
// cgroup, which the daemon started it in) and the sandbox's hostname.
func identify(p *guestapi.Prepare) error {
	// Namespaces are per thread: this one is for the cgroup2 mount; the
	// spawner makes its own for what it forks.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unsharing cgroup namespace: %w", err)
	}
	if p.CgroupV2 {
		root, err := os.OpenFile("/", unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		r := &rootMounter{root: root}
		err = r.mount("/sys/fs/cgroup", "cgroup2", "cgroup2", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		root.Close()
		if err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(p.Hostname)); err != nil {
		return fmt.Errorf("setting hostname: %w", err)
	}
	return writeIdentity(p.Hostname)
}

// warmUp runs a command that only exits through the whole exec path (the
// request read and decoded, the spawner, pipes, output ring, pidfd wait,
// and the stream with its held answer, on a socketpair) while nobody
// waits on it: the code and the heap are then warm for the sandbox's
// first command. The first command of a fresh guest took some 30 page
// faults more than the next (about 1 ms on a small VM) before it did.
func warmUp(sp *spawner) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil // best effort: the sandbox works without it
	}
	ours, theirs, err := fileConns(fds)
	if err != nil {
		return nil
	}
	cmd := "true"
	if prog := exitProgram(); prog != nil {
		defer prog.Close()
		cmd = fmt.Sprintf("/proc/self/fd/%d", prog.Fd())
	}
	// A root without true is not an error: the start just fails.
	if err := wire.NewWriter(theirs).WriteJSON(wire.Request, guestapi.Request{Op: guestapi.OpStart, Start: &guestapi.StartRequest{Cmd: []string{cmd}, Attach: true}}); err != nil {
		ours.Close()
		theirs.Close()
		return nil
	}
	// The client's side: the stream to its exit, released, then closed
	// (which ends handle below).
	go func() {
		defer theirs.Close()
		fr := wire.NewReader(theirs)
		for {
			f, err := fr.Read()
			if err != nil {
				return
			}
			if f.Type == wire.Exit {
				wire.NewWriter(theirs).Write(wire.Release, nil)
				return
			}
		}
	}()
	s := newServer(guestapi.ServeConfig{Env: []string{"PATH=/usr/bin:/bin"}, Workdir: "/"}, nil, sp, slog.New(slog.DiscardHandler))
	s.handle(ours) // closes ours
	// The next command's pipes it made are this throwaway server's.
	s.takeOutPipes().close()
	return nil
}

// exitProgram is exitprog's program in a sealed memfd (nil where there
// is none, or no memfd to run): the warm-up's command. The image's `true`
// is a dynamically linked program whose loader, on a nested VM, cost the
// warm-up 1.5-2.5 ms of CPU per guest; this one costs a fork, an exec and
// an exit. Its descriptor is close-on-exec: the kernel opens the program
// by its /proc/self/fd path before it closes those, and the command
// keeps nothing of it. Nothing in the sandbox can reach it: the guest is
// not dumpable, so its /proc/1/fd is closed to the sandbox, and the memfd
// is closed once the warm-up is done.
func exitProgram() *os.File {
	prog := exitprog.ELF()
	if prog == nil {
		return nil
	}
	// MFD_EXEC where the kernel knows it (6.3 on), which may make
	// memfds non-executable by default (vm.memfd_noexec).
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate("paddock-warm-up", flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("paddock-warm-up", flags)
	}
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), "paddock-warm-up")
	if _, err := f.Write(prog); err != nil {
		f.Close()
		return nil
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil
	}
	return f
}

// fileConns makes net.Conns of a socketpair's fds (which it takes).
func fileConns(fds [2]int) (net.Conn, net.Conn, error) {
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "warm-up")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				unix.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}

// restrictAll sets no_new_privs (unless the image allows setuid
// programs; the filter is then loaded with the guest's CAP_SYS_ADMIN in
// its user namespace) and installs the seccomp filter on every thread of
// the guest, so that neither the guest nor anything it starts can make
// the syscalls the profile refuses.
func restrictAll(prog []byte, noNewPrivs bool) error {
	if noNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	if len(prog) == 0 {
		return nil
	}
	if err := seccompload.AllThreads(prog); err != nil {
		return fmt.Errorf("loading seccomp filter: %w", err)
	}
	return nil
}

// buildRoot builds the root filesystem and enters it. Everything it
// needs from the host arrives as file descriptors: the guest runs as an
// unprivileged host uid and may not be able to walk the daemon's
// directories by path.
func buildRoot(cfg *guestapi.Prepare, fds []int) error {
	fdOf := func(m guestapi.Mount, what string) (int, error) {
		if m.FD < 0 || m.FD >= len(fds) {
			return -1, fmt.Errorf("%s: fd %d not received", what, m.FD)
		}
		return fds[m.FD], nil
	}
	// Nothing mounted here may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("making mounts slaves: %w", err)
	}
	disk, err := fdOf(cfg.Disk, "disk")
	if err != nil {
		return err
	}
	layers := make([]int, len(cfg.Layers))
	for i, l := range cfg.Layers {
		if layers[i], err = fdOf(l, fmt.Sprintf("layer %d", i)); err != nil {
			return err
		}
	}
	root, err := assembleRoot(layers, disk)
	if err != nil {
		return err
	}
	defer root.Close()
	r := &rootMounter{root: root}
	for _, b := range cfg.Binds {
		fd, err := fdOf(b, b.Dest)
		if err != nil {
			return err
		}
		if err := r.bind(b, fd); err != nil {
			return err
		}
	}
	steps := []func() error{
		func() error {
			return r.mount("/proc", "proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		},
	}
	if !cfg.NetReady {
		steps = append(steps, func() error {
			return r.mount("/sys", "sysfs", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		})
	}
	steps = append(steps, r.dev, r.mask, r.bootID)
	if !cfg.NetReady {
		steps = append(steps, loopbackUp, enablePing)
	}
	steps = append(steps, func() error { return enterRoot(root) })
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// stageDir is where the root filesystem is assembled, on a tmpfs private
// to the guest's mount namespace (it hides the host's directory there, and
// is detached once the root is entered). Every Linux
// host has a world-traversable /tmp; the daemon's own directories may not
// be traversable by the guest's unprivileged uid.
const stageDir = "/tmp"

// assembleRoot attaches the layers and the disk under the staging tmpfs
// and mounts the overlay root there (lower layers read-only, upper and
// work dirs on the disk). It returns a handle on the overlay's root.
func assembleRoot(layers []int, disk int) (*os.File, error) {
	if err := unix.Mount("tmpfs", stageDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=64k"); err != nil {
		return nil, fmt.Errorf("mounting staging tmpfs: %w", err)
	}
	attach := func(fd int, name string) (string, error) {
		p := stageDir + "/" + name
		if err := unix.Mkdir(p, 0o700); err != nil {
			return "", fmt.Errorf("creating %s: %w", p, err)
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return "", fmt.Errorf("attaching %s: %w", name, err)
		}
		return p, nil
	}
	var lowers []string
	for i, fd := range layers {
		p, err := attach(fd, fmt.Sprintf("l%d", i))
		if err != nil {
			return nil, err
		}
		lowers = append(lowers, p)
	}
	d, err := attach(disk, "disk")
	if err != nil {
		return nil, err
	}
	rootfs := stageDir + "/rootfs"
	if err := unix.Mkdir(rootfs, 0o755); err != nil {
		return nil, fmt.Errorf("creating rootfs: %w", err)
	}
	// Overlay metadata goes to user.* xattrs (userxattr): trusted.* needs
	// privilege in the initial user namespace.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work,userxattr", strings.Join(lowers, ":"), d, d)
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		return nil, fmt.Errorf("mounting overlay rootfs: %w", err)
	}
	root, err := os.OpenFile(rootfs, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening rootfs: %w", err)
	}
	return root, nil
}

// rootMounter mounts onto paths resolved inside the rootfs, never on the
// host: a symlink in the sandbox's writable layer (which may come from a
// snapshot the sandbox wrote) must not redirect a mount.
type rootMounter struct{ root *os.File }

// target resolves path inside the root, creating it (a directory, or an
// empty file when file is set) if missing, and returns an O_PATH handle.
func (r *rootMounter) target(path string, file bool) (*os.File, error) {
	if h := r.existing(path, file); h != nil {
		return h, nil
	}
	if file {
		dir, err := mkdirAllInRoot(r.root, filepath.Dir(path), 0o755)
		if err != nil {
			return nil, fmt.Errorf("creating %s: %w", filepath.Dir(path), err)
		}
		defer dir.Close()
		name := filepath.Base(path)
		fd, err := unix.Openat(int(dir.Fd()), name, unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0o644)
		if errors.Is(err, unix.ELOOP) {
			// A symlink where a file is bound (an image's /etc/resolv.conf
			// pointing at a resolver's runtime file): a mount cannot sit on
			// a symlink, so it is replaced, in the writable layer only.
			if err = unix.Unlinkat(int(dir.Fd()), name, 0); err == nil {
				fd, err = unix.Openat(int(dir.Fd()), name, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0o644)
			}
		}
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("creating %s: %w", path, err)
		}
		if fd >= 0 {
			unix.Close(fd)
		}
		h, err := openInRoot(r.root, path)
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
		return h, nil
	}
	// A directory paddock binds (/run/paddock, a volume's mount point)
	// must be one in the image: a symbolic link there would put the
	// mount wherever it leads (under the root, but over something else).
	if isLink(r.root, path) {
		return nil, errdefs.New(errdefs.ErrInvalid, "the image has a symbolic link at %s, where the sandbox mounts a directory; it must be a directory or absent", path)
	}
	h, err := mkdirAllInRoot(r.root, path, 0o755)
	if err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			// What the image has on the way is not a directory (a file,
			// a dangling or looping link).
			return nil, errdefs.New(errdefs.ErrInvalid, "the image cannot hold a directory at %s, where the sandbox mounts one: %v", path, err)
		}
		return nil, fmt.Errorf("creating %s: %w", path, err)
	}
	return h, nil
}

// existing returns an O_PATH handle on path, resolved inside the root,
// if it is there already and of the kind target makes (a regular file
// when file is set, a directory otherwise), its last element no symbolic
// link; else nil, and target goes the long way. Most targets are in the
// image (the host image's skeleton holds paddock's own): one openat2
// finds them, where the long way took five to seven calls.
func (r *rootMounter) existing(path string, file bool) *os.File {
	if strings.Trim(path, "/") == "" {
		return nil
	}
	h, err := openInRootFlags(r.root, path, unix.O_NOFOLLOW)
	if err != nil {
		return nil
	}
	var st unix.Stat_t
	want := uint32(unix.S_IFDIR)
	if file {
		want = unix.S_IFREG
	}
	if unix.Fstat(int(h.Fd()), &st) != nil || st.Mode&unix.S_IFMT != want {
		h.Close()
		return nil
	}
	return h
}

// isLink reports whether path's last element, its parent resolved
// inside root, is a symbolic link. Links on the way (/var/run -> /run)
// resolve inside the root and are fine.
func isLink(root *os.File, path string) bool {
	dir, err := openInRoot(root, filepath.Dir(path))
	if err != nil {
		return false
	}
	defer dir.Close()
	var st unix.Stat_t
	err = unix.Fstatat(int(dir.Fd()), filepath.Base(path), &st, unix.AT_SYMLINK_NOFOLLOW)
	return err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

func procPath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

func (r *rootMounter) mount(path, source, fstype string, flags uintptr, data string) error {
	t, err := r.target(path, false)
	if err != nil {
		return err
	}
	defer t.Close()
	if err := unix.Mount(source, procPath(t), fstype, flags, data); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", fstype, path, err)
	}
	return nil
}

// bind attaches a host directory at b.Dest: a detached, read-only mount
// the daemon made (idmapped where the kernel allows).
func (r *rootMounter) bind(b guestapi.Mount, fd int) error {
	t, err := r.target(b.Dest, b.File)
	if err != nil {
		return err
	}
	defer t.Close()
	if err := unix.MoveMount(fd, "", int(t.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("attaching %s: %w", b.Dest, err)
	}
	return nil
}

// remountReadonly re-resolves path (a handle opened before a mount refers
// to what is underneath it) and makes the mount on it read-only.
func (r *rootMounter) remountReadonly(path string) error {
	h, err := openInRoot(r.root, path)
	if err != nil {
		return fmt.Errorf("reopening %s: %w", path, err)
	}
	defer h.Close()
	if err := remountReadonly(procPath(h)); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// remountReadonly makes a bind mount read-only, keeping the flags that the
// kernel locked when the mount namespace was copied into our user
// namespace (dropping a locked flag fails with EPERM).
func remountReadonly(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", path, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV)
	for _, f := range []struct{ st, ms int64 }{
		{unix.ST_NOEXEC, unix.MS_NOEXEC},
		{unix.ST_NOATIME, unix.MS_NOATIME},
		{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
		{unix.ST_RELATIME, unix.MS_RELATIME},
	} {
		if st.Flags&f.st != 0 {
			flags |= uintptr(f.ms)
		}
	}
	if err := unix.Mount("", path, "", flags, ""); err != nil {
		return fmt.Errorf("remounting read-only: %w", err)
	}
	return nil
}

// dev builds a minimal /dev: a tmpfs with the harmless character devices
// bind-mounted from the host, a private devpts, shm and mqueue. The tmpfs
// is fresh and nothing else runs in the sandbox yet, so what goes in it is
// made and mounted through a handle on it, not resolved from the root each
// time (which took three resolutions and a creation per device).
func (r *rootMounter) dev() error {
	if err := r.mount("/dev", "tmpfs", "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return err
	}
	dev, err := openInRoot(r.root, "/dev")
	if err != nil {
		return err
	}
	defer dev.Close()
	dfd, in := int(dev.Fd()), procPath(dev)+"/"
	for _, d := range guestapi.Devices {
		fd, err := unix.Openat(dfd, d, unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0o644)
		if err != nil {
			return fmt.Errorf("creating /dev/%s: %w", d, err)
		}
		unix.Close(fd)
		if err := unix.Mount("/dev/"+d, in+d, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", d, err)
		}
	}
	for _, m := range []struct {
		name, source, fstype string
		flags                uintptr
		data                 string
		optional             bool
	}{
		{"pts", "devpts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", false},
		{"shm", "shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "mode=1777,size=65536k", false},
		// mqueue needs an IPC namespace owned by our user namespace; it
		// is a nicety, so a kernel without it does not fail the sandbox.
		{"mqueue", "mqueue", "mqueue", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", true},
	} {
		if err := unix.Mkdirat(dfd, m.name, 0o755); err != nil {
			return fmt.Errorf("creating /dev/%s: %w", m.name, err)
		}
		if err := unix.Mount(m.source, in+m.name, m.fstype, m.flags, m.data); err != nil && !m.optional {
			return fmt.Errorf("mounting %s on /dev/%s: %w", m.fstype, m.name, err)
		}
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := unix.Symlinkat(target, dfd, name); err != nil {
			return fmt.Errorf("linking /dev/%s: %w", name, err)
		}
	}
	return nil
}

// mask hides and write-protects the kernel interfaces runc does.
func (r *rootMounter) mask() error {
	null, err := openInRoot(r.root, "/dev/null")
	if err != nil {
		return err
	}
	defer null.Close()
	for _, p := range maskedPaths {
		h, err := openInRoot(r.root, p)
		if err != nil {
			continue // not on this kernel
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(h.Fd()), &st); err != nil {
			h.Close()
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = unix.Mount("tmpfs", procPath(h), "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555")
		} else {
			err = unix.Mount(procPath(null), procPath(h), "", unix.MS_BIND, "")
		}
		h.Close()
		if err != nil {
			return fmt.Errorf("masking %s: %w", p, err)
		}
	}
	for _, p := range readonlyPaths {
		h, err := openInRoot(r.root, p)
		if err != nil {
			continue
		}
		path := procPath(h)
		err = unix.Mount(path, path, "", unix.MS_BIND|unix.MS_REC, "")
		h.Close()
		if err == nil {
			err = r.remountReadonly(p)
		}
		if err != nil {
			return fmt.Errorf("making %s read-only: %w", p, err)
		}
	}
	return nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening socket for lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("reading lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing lo up: %w", err)
	}
	return nil
}

// enablePing lets every group of the sandbox open ICMP echo sockets
// (SOCK_DGRAM, IPPROTO_ICMP) in its network namespace, where the kernel's
// default allows none: ping works without CAP_NET_RAW, which sandboxes do
// not get. The range is read in our user namespace: all its 65536 gids.
func enablePing() error {
	if err := os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 65535"), 0); err != nil {
		return fmt.Errorf("allowing ICMP echo sockets: %w", err)
	}
	return nil
}

// enterRoot makes root the guest's root. pivot_root would do it, but
// it walks every thread on the host under the task list lock to move
// the ones whose root is the old one (chroot_fs_refs: 27% of a guest's
// CPU under churn with 7000 threads on the host). Instead the root's
// mount is moved onto "/" and the guest chroots into it (runc's
// no-pivot path), and what that leaves in the mount namespace is made
// unreachable:
//
//   - The sandbox's root now sits on top of the forker's read-only
//     tmpfs at "/" (guestfork's isolateMounts: the host's tree is not
//     in it). No path leads below the top of that stack: an absolute
//     path starts at the process's root, and ".." at the root of a
//     mount climbs to its mount point and then follows the mounts on
//     it back to the top, so even a chroot escape with CAP_SYS_CHROOT
//     (Docker's set has it) ends at the sandbox's root. Only
//     unmounting the root would uncover the tmpfs, which needs
//     CAP_SYS_ADMIN in the guest's user namespace and umount2 past
//     the seccomp filter: no process of the sandbox has either, and
//     the guest loses umount2 to the filter at the end of Prepare.
//   - The staging tmpfs, with the layers and the disk attached under
//     it, is detached, as pivot_root's old root was.
//   - The forker's proc and sysfs (of the host's PID and network
//     namespaces) stay under the root, mounted but out of reach; each
//     is covered with an empty read-only directory, so that in any copy of
//     this namespace (a nested user namespace, were the filter ever to
//     allow one) the kernel finds no fully visible proc or sysfs there
//     and refuses a fresh, unmasked instance, as it does for the
//     sandbox's own masked ones (mount_too_revealing).
//
// What differs from pivot_root: the forker's tree is hidden, not gone;
// code that held CAP_SYS_ADMIN here without the filter (the guest
// itself, during Prepare) could uncover it.
func enterRoot(root *os.File) error {
	if err := unix.Fchdir(int(root.Fd())); err != nil {
		return fmt.Errorf("entering rootfs: %w", err)
	}
	// Paths below resolve from the guest's root, still the forker's
	// tmpfs: an absolute path starts at the root itself, not at what is
	// mounted on it, so "/tmp" and "/proc" are the forker's until the
	// chroot.
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving rootfs onto /: %w", err)
	}
	if err := unix.Unmount(stageDir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the staging tmpfs: %w", err)
	}
	// The cover is a bind of the forker's /tmp, an empty directory of
	// its read-only tmpfs now that the staging tmpfs is gone: it makes
	// no superblock (each new one takes global locks, and more work at
	// exit), and it inherits the forker's read-only flag, locked.
	for _, p := range []string{"/proc", "/sys"} {
		if err := unix.Mount(stageDir, p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("covering the forker's %s: %w", p, err)
		}
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot into rootfs: %w", err)
	}
	return unix.Chdir("/")
}

// writeIdentity gives the sandbox a hosts file that resolves its hostname
// (sudo, Java and others stall or complain otherwise).
func writeIdentity(hostname string) error {
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost %[1]s\n::1\tlocalhost ip6-localhost ip6-loopback %[1]s\n", hostname)
	// An OCI image need not have an /etc.
	if err := os.MkdirAll("/etc", 0o755); err != nil {
		return fmt.Errorf("creating /etc: %w", err)
	}
	// The daemon may have bound its own over them (read-only; its hosts
	// file names the sandbox and paddock.internal).
	if err := os.WriteFile("/etc/hosts", []byte(hosts), 0o644); err != nil && !errors.Is(err, unix.EROFS) {
		return fmt.Errorf("writing /etc/hosts: %w", err)
	}
	if err := os.WriteFile("/etc/hostname", []byte(hostname+"\n"), 0o644); err != nil && !errors.Is(err, unix.EROFS) {
		return fmt.Errorf("writing /etc/hostname: %w", err)
	}
	return nil
}

// File descriptors the daemon passes to the guest.
const (
	fdSync   = 3 // SOCK_SEQPACKET to the daemon for config and ready
	fdListen = 4 // the control socket listener
)
