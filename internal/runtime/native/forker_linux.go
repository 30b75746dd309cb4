package native

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/deathsig"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/guestfork"
)

// The forker is a small helper process (internal/guestfork, in C) that
// forks guests for the daemon. Forking into a new user namespace cannot
// use vfork (the child waits for its uid map): the forker's child shares
// its memory on a stack of its own until its exec (x86-64), or is a fork
// of a single-threaded C process with a few pages, where a fork of the
// daemon (or of a Go forker) would copy the page tables of every page its
// runtime touched and fault on each it wrote afterwards. It runs at a low
// priority, and so do the guests it forks until the daemon hands one a
// sandbox: getting guests ready ahead of time must not slow down the
// sandboxes in use. It runs in its own mount namespace holding only what
// a guest needs before it enters its sandbox's root.

// forkRequest asks the forker for a guest.
type forkRequest = guestfork.Request

// forker is the daemon's handle on the helper process.
type forker struct {
	mu   sync.Mutex // one request at a time on the socket
	sock *os.File
	cmd  *exec.Cmd
	dead <-chan struct{} // closed once the helper has exited and is reaped
}

// startForker starts the helper from the daemon's own binary, where the
// forker's C side takes the process before the Go runtime starts; it
// forks every guest from exe, the sealed guest binary, or from fast, the
// sealed fast guest, when there is one (nil: none). base, if not nil, is
// a split seccomp filter's base, which the forker loads and its guests
// inherit (seccomp.Split).
func startForker(exe, fast *os.File, base []byte) (*forker, error) {
	var filter *os.File
	if base != nil {
		var err error
		if filter, err = filterFile(base); err != nil {
			return nil, fmt.Errorf("starting forker: %w", err)
		}
		defer filter.Close()
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating forker socket: %w", err)
	}
	ours := os.NewFile(uintptr(pair[0]), "forker")
	theirs := os.NewFile(uintptr(pair[1]), "forker-child")
	defer theirs.Close()
	cmd := exec.Command("/proc/self/exe", append([]string{guestfork.ForkerVerb}, guestapi.Devices...)...)
	cmd.Args[0] = "paddock"
	// fds 3 to 6: the socket, guestfork.FDExe, FDFast and FDSeccomp (a
	// nil one is closed in the child, not left to a descriptor the
	// daemon inherited).
	cmd.ExtraFiles = []*os.File{theirs, exe, fast, filter}
	cmd.Stderr = os.Stderr
	cmd.Env = []string{}
	// It dies with the daemon (deathsig: the signal follows the thread
	// that started it, which deathsig holds until it has exited); the
	// guests it forked do not (they are reparented), and a new daemon
	// starts a new forker.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	dead, err := deathsig.Start(cmd)
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("starting forker: %w", err)
	}
	return &forker{sock: ours, cmd: cmd, dead: dead}, nil
}

// filterFile is prog in a memfd, for a forker to read at its start.
func filterFile(prog []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("paddock-seccomp-base", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "paddock-seccomp-base")
	if _, err := f.Write(prog); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the seccomp base filter: %w", err)
	}
	return f, nil
}

// fork asks for a guest; it returns its pid and a pidfd.
func (f *forker) fork(req forkRequest, fds []int) (int, int, error) {
	return f.send(req.Encode(), fds)
}

// send sends the forker a request as encoded and reads its answer.
func (f *forker) send(msg []byte, fds []int) (int, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := unix.Sendmsg(int(f.sock.Fd()), msg, unix.UnixRights(fds...), nil, 0); err != nil {
		return 0, -1, fmt.Errorf("asking the forker: %w", err)
	}
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(int(f.sock.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil || n == 0 {
		return 0, -1, fmt.Errorf("reading the forker's answer: %v", err)
	}
	pidfd := -1
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			for _, fd := range got {
				if pidfd < 0 {
					pidfd = fd
				} else {
					unix.Close(fd)
				}
			}
		}
	}
	pid, err := guestfork.DecodeReply(buf[:n])
	if err == nil && pidfd < 0 {
		err = errors.New("the forker sent no pidfd")
	}
	if err != nil {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		return 0, -1, err
	}
	return pid, pidfd, nil
}

// alive reports whether the helper process still runs (a killed one
// that is not yet reaped does not).
func (f *forker) alive() bool {
	select {
	case <-f.dead:
		return false
	default:
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", f.cmd.Process.Pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(st), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// close stops the helper.
func (f *forker) close() {
	f.sock.Close()
	f.cmd.Process.Kill()
	<-f.dead
}

// raisePriority gives guest pid, in cgroup cg, the normal priority: every
// thread of the process nice 0, and the group the default CPU weight
// (background, which a guest made ahead of time starts with). Nice alone
// weighs only against the processes of the same cgroup: a guest built at
// nice 10 in a group of its own took as much CPU as a sandbox's, in a
// burst of creates and under the exec of a running sandbox alike.
func raisePriority(pid int, cg *cgroup.Group) {
	if cg != nil {
		cg.SetBackground(false) // best effort, like the threads' priority
	}
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			unix.Setpriority(unix.PRIO_PROCESS, tid, 0)
		}
	}
}

// forkerPidsGroup puts a new forker in the parent group of the v1 pids
// hierarchy, where the guests it forks then start: their own threads
// count against no sandbox's pids limit (internal/cgroup's AddToParentPids
// says why). Where that cannot be, the guests still leave the daemon's
// pids group by AddProc, as before.
func (r *Runtime) forkerPidsGroup(f *forker) {
	err := r.cfg.Cgroups.AddToParentPids(f.cmd.Process.Pid)
	if err != nil && !errors.Is(err, errdefs.ErrUnavailable) {
		r.log.Warn("moving the guest forker to the parent pids group", "err", err)
	}
}
