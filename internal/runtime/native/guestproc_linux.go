package native

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/guestbin"
	"github.com/paddock-dev/paddock/internal/guestfork"
	"github.com/paddock-dev/paddock/internal/runtime"
	"github.com/paddock-dev/paddock/internal/spare"
)

// idRange is the number of uids and gids each sandbox maps.
const idRange = 65536

// guestProc is a started guest that has not been given a sandbox yet: it
// waits in its fresh namespaces for its Config.
type guestProc struct {
	sb   *Sandbox // id, pid, pidfd watcher, uid base, cgroup
	sync *os.File // our end of the sync socket
	dir  string   // run dir: guest.sock and guest.log
	// image is the image the guest's rootfs was built from ("" until
	// prepared), size its disk's size; warm marks a guest made ahead of
	// time.
	image string
	// volume is the id of its disk: "warm-<id>" until a create takes it.
	volume string
	warm   bool
	// diskFrom and diskBytes are the pool source a warm guest's disk was
	// made from (a snapshot image, or "" for a new disk) and its size.
	diskFrom  string
	diskBytes int64
	// net is what the network made for it (files to bind, environment);
	// wired says it was made (a blank guest may have it before it is
	// bound).
	net   runtime.NetSetup
	wired bool
	// netns is the network slot the guest was forked into (nil: it has
	// a namespace of its own).
	netns runtime.NetNS
	// limits are those set on a warm guest's cgroup ahead of time; raised:
	// its threads run at the normal priority already.
	limits cgroup.Limits
	raised bool
	// pidsApart: the guest's process is outside its sandbox's pids
	// group (v1); Prepare hands it the group's tasks file for its
	// spawner thread, and it keeps no spare threads.
	pidsApart bool
}

// sealedSelf copies the guest binary into a sealed memfd: the binary at
// path; when path is empty, the slim guest this build embeds
// (internal/guestbin), or else the running binary. The forker and every
// guest are exec'd from it, so /proc/1/exe in a sandbox is this memfd:
// nothing can write it (F_SEAL_WRITE), and the host's binary is never
// exposed (CVE-2019-5736). One copy serves every sandbox.
func sealedSelf(path string) (*os.File, error) {
	src, err := guestbin.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	return sealedCopy("paddock-guest", src)
}

// sealedFast is the fast guest in a sealed memfd, as sealedSelf makes the
// guest binary's: the file cfg.FastGuest names, or the one this build
// embeds; nil when there is none or cfg asks for none.
func sealedFast(cfg Config) (*os.File, error) {
	switch {
	case cfg.NoFastGuest:
		return nil, nil
	case cfg.FastGuest != "":
		src, err := os.Open(cfg.FastGuest)
		if err != nil {
			return nil, err
		}
		defer src.Close()
		return sealedCopy("paddock-guest", src)
	case cfg.GuestBinary == "" && guestbin.Fast() != nil:
		return sealedCopy("paddock-guest", bytes.NewReader(guestbin.Fast()))
	}
	return nil, nil
}

// sealedCopy copies src into a new sealed, executable memfd.
func sealedCopy(name string, src io.Reader) (*os.File, error) {
	// MFD_EXEC where the kernel knows it (6.3 on): with vm.memfd_noexec
	// set, a memfd made without it cannot be executed.
	flags := unix.MFD_CLOEXEC | unix.MFD_ALLOW_SEALING
	fd, err := unix.MemfdCreate(name, flags|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate(name, flags)
	}
	if errors.Is(err, unix.EACCES) {
		return nil, fmt.Errorf("memfd_create: %w: vm.memfd_noexec is 2, which refuses every executable memfd the guests run from; set it to 1 or 0", err)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return nil, err
	}
	if err := seal(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("sealing memfd: %w", err)
	}
	return f, nil
}

// sealTries bounds seal's attempts, sealRetry is the wait between them.
const (
	sealTries = 10
	sealRetry = 100 * time.Millisecond
)

// seal seals f against every change. F_SEAL_WRITE fails with EBUSY while
// any of the file's pages has a reference beyond the page cache's; the
// kernel waits some 150 ms for those to go, but under load a page a
// kernel thread holds a while longer (the memory monitor's sampling,
// compaction) failed a daemon's start in a CI run: it is tried again.
func seal(f *os.File) error {
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	var err error
	for range sealTries {
		if _, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); !errors.Is(err, unix.EBUSY) {
			return err
		}
		time.Sleep(sealRetry)
	}
	return err
}

// spawnGuest starts a guest in new user, mount, pid, net, ipc and uts
// namespaces, with root mapped to uidBase, in cgroup cg, with dir as its
// run dir. Starting a Go process costs several milliseconds of page faults
// on small VMs, which is why the pool does it ahead of time. A guest made
// ahead of time (warm) starts at the forker's low priority; any other is
// awaited, and starts at the normal one.
func (r *Runtime) spawnGuest(uidBase uint32, dir string, cg *cgroup.Group, warm bool, netns runtime.NetNS) (_ *guestProc, retErr error) {
	// A removed sandbox's run dir, emptied (emptyRunDir), spares the
	// directory's and the log's inodes: on ext4 under churn each costs
	// 0.1-0.4 ms of CPU to make, and as much to delete.
	recycled := r.runSpares != nil && r.runSpares.Take(dir)
	if !recycled {
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, fmt.Errorf("creating guest dir: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	socket := filepath.Join(dir, "guest.sock")
	logPath := filepath.Join(dir, "guest.log")
	// The descriptors the guest gets are made with plain system calls:
	// package os and net would register each with the poller and make
	// it blocking again when handed over, twenty calls a guest more
	// (issue 21).
	ln, err := listenUnix(socket)
	if err != nil {
		return nil, fmt.Errorf("listening on guest socket: %w", err)
	}
	defer unix.Close(ln)

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating sync socket: %w", err)
	}
	parentSync := os.NewFile(uintptr(pair[0]), "sync")
	childSync := os.NewFile(uintptr(pair[1]), "sync-child")
	defer childSync.Close()
	// A spare's log is empty already, and truncating it again would have
	// ext4 write it back when the guest closes it (auto_da_alloc).
	logFlags := unix.O_WRONLY | unix.O_CREAT | unix.O_CLOEXEC
	if !recycled {
		logFlags |= unix.O_TRUNC
	}
	logFD, err := unix.Open(logPath, logFlags, 0o600)
	if err != nil {
		parentSync.Close()
		return nil, &os.PathError{Op: "open", Path: logPath, Err: err}
	}
	defer unix.Close(logFD)
	devNull, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		parentSync.Close()
		return nil, &os.PathError{Op: "open", Path: os.DevNull, Err: err}
	}
	defer unix.Close(devNull)

	fds := []int{guestfork.FDStdin: devNull, guestfork.FDLog: logFD, guestfork.FDSync: int(childSync.Fd()), guestfork.FDListen: ln}
	req := forkRequest{UIDBase: uidBase, IDs: idRange, Urgent: !warm}
	if r.cfg.Cgroups.Mode() == cgroup.V2 {
		cgfd, err := cg.OpenDirFD()
		if err != nil {
			parentSync.Close()
			return nil, err
		}
		defer cgfd.Close()
		req.UseCgroup = true
		fds = append(fds, int(cgfd.Fd()))
	}
	if netns != nil {
		req.NetNS = true
		fds = append(fds, netns.FD()) // last, as the forker expects
	}
	pid, pidfd, err := r.fork(req, fds)
	if err != nil {
		parentSync.Close()
		return nil, err
	}
	sb := &Sandbox{socket: socket, done: make(chan struct{}), active: make(chan struct{}), limited: make(chan struct{}), sent: make(chan struct{}), st: state{PID: pid, UIDBase: uidBase}}
	if err := sb.watch(pidfd); err != nil {
		unix.Kill(pid, unix.SIGKILL)
		parentSync.Close()
		return nil, err
	}
	g := &guestProc{sb: sb, sync: parentSync, dir: dir, netns: netns}
	// The start time identifies the guest across pid reuse (Restore
	// checks it); read once the pidfd pins the pid, so that it is ours.
	st, err := runtime.ProcStartTime(pid)
	if err != nil {
		g.kill()
		return nil, fmt.Errorf("reading the guest's start time: %w", err)
	}
	sb.st.StartTime = st
	if r.cfg.Cgroups.Mode() == cgroup.V1 {
		// In the pids hierarchy the guest stays where its forker is
		// (forkerPidsGroup): its spawner thread joins the sandbox's
		// group at Prepare, and with it all the sandbox runs.
		err := cg.AddProcButPids(pid)
		g.pidsApart = err == nil
		if errors.Is(err, errdefs.ErrUnavailable) {
			err = cg.AddProc(pid)
		}
		if err != nil {
			g.kill()
			return nil, fmt.Errorf("moving guest into its cgroup: %w", err)
		}
	}
	return g, nil
}

// listenUnix makes a listening, blocking stream socket at path.
func listenUnix(path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "bind", Path: path, Err: err}
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// emptyRunDir empties a removed sandbox's run dir for spare.Pool.Give:
// its log truncated, its socket and anything else but a directory
// removed (the runtime makes none there).
func emptyRunDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		switch {
		case e.IsDir():
			return fmt.Errorf("unexpected directory %s", p)
		case e.Name() == "guest.log" && e.Type().IsRegular():
			err = spare.Truncate(p)
		default:
			err = os.Remove(p)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// kill ends a guest that will not become a sandbox, and removes its run
// dir.
func (g *guestProc) kill() {
	g.sb.Kill()
	<-g.sb.done
	if g.sync != nil {
		g.sync.Close()
	}
	os.RemoveAll(g.dir)
}

// call sends one Config message and waits for the guest's answer.
func (g *guestProc) call(ctx context.Context, cfg *guestapi.Config, fds []int, logPath string) (*guestapi.Ready, error) {
	if err := guestapi.SendConfig(g.sync, cfg, fds); err != nil {
		return nil, err
	}
	rd, err := guestapi.WaitReady(ctx, g.sync, g.sb.done)
	if err != nil {
		return nil, fmt.Errorf("%w%s", err, guestapi.LogTail(logPath))
	}
	return rd, nil
}

// openNS opens the namespace of kind ("user", "net") of process pid.
// Not through package os, which would try to register the descriptor
// with its poller and make it blocking again at Fd.
func openNS(pid int, kind string) (int, error) {
	path := fmt.Sprintf("/proc/%d/ns/%s", pid, kind)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// detachedTree clones the mount tree at path as a detached, read-only
// mount for a guest to attach. With a user namespace (usernsFD >= 0) its
// owners are mapped through it (an idmapped mount).
func detachedTree(path string, usernsFD int, setuid bool) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID}
	if setuid {
		// The image allows setuid programs: their bits count.
		attr.Attr_set &^= unix.MOUNT_ATTR_NOSUID
		attr.Attr_clr = unix.MOUNT_ATTR_NOSUID
	}
	if usernsFD >= 0 {
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(usernsFD)
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr %s: %w", path, err)
	}
	return fd, nil
}

// writableTree clones the mount at path as a detached mount for a guest
// to attach, idmapped through the user namespace usernsFD when that is
// not -1, and read-only if asked. It serves the sandbox's disk and the
// volumes it mounts.
func writableTree(path string, usernsFD int, readOnly bool) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID}
	if readOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if usernsFD >= 0 {
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(usernsFD)
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount_setattr %s: %w", path, err)
	}
	return fd, nil
}
