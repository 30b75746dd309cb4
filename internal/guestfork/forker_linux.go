package guestfork

import (
	"encoding/json"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reaper"
)

// Nice is the forker's (and fresh guests') scheduling priority.
const Nice = 10

// The descriptors the forker starts with.
const (
	fdSocket = 3 // SOCK_SEQPACKET to the daemon: requests in, replies out
	fdExe    = 4 // the sealed guest binary
)

// Descriptors of a fork request, in order.
const (
	FDStdin = iota
	FDLog
	FDSync
	FDListen
	FDCgroup // v2 only: the cgroup to clone into
)

// The hidden verbs the daemon starts its guest binary with
// (internal/guestmain runs them).
const (
	GuestVerb  = "guest"        // PID 1 of a sandbox
	ForkerVerb = "guest-forker" // the forker
)

// Request asks the forker for a guest.
type Request struct {
	// UIDBase is the host uid (and gid) that root in the guest's user
	// namespace maps to; IDs is how many ids are mapped from there.
	UIDBase uint32 `json:"uid_base"`
	IDs     uint32 `json:"ids"`
	// UseCgroup: the request carries a cgroup v2 directory (FDCgroup)
	// that the guest is cloned into.
	UseCgroup bool `json:"use_cgroup"`
	// Urgent forks the guest at the normal priority: a sandbox waits for
	// it (a resume, a create that found no warm guest).
	Urgent bool `json:"urgent,omitempty"`
	// NetNS: the request's last descriptor is a network namespace the
	// daemon made (a network slot, owned by the host's user namespace),
	// which the guest is forked into instead of a new one of its own.
	NetNS bool `json:"net_ns,omitempty"`
}

// Reply answers a Request; the guest's pidfd comes with it.
type Reply struct {
	PID   int    `json:"pid"`
	Error string `json:"error,omitempty"`
}

// Run is the forker process: it serves fork requests on fd 3 until the
// daemon closes it, forking guests from the sealed binary on fd 4, and
// reaps the guests it forked.
func Run() error {
	var err error
	// To return to after forking a guest into a daemon's namespace.
	if ownNetns, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return fmt.Errorf("opening the forker's network namespace: %w", err)
	}
	if err := isolateMounts(); err != nil {
		return err
	}
	sock := os.NewFile(fdSocket, "forker")
	// The guest's own descriptors take 0-4 in the child: keep the binary
	// out of their way, or exec would find a socket at its path.
	exeFD, err := unix.FcntlInt(fdExe, unix.F_DUPFD_CLOEXEC, 64)
	if err != nil {
		return fmt.Errorf("moving the guest binary's fd: %w", err)
	}
	unix.Close(fdExe)
	exe := os.NewFile(uintptr(exeFD), "guest-exe")
	lowerPriority()
	go reaper.Run(reaper.Watch(), nil) // the guests this process forked
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(8*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(int(sock.Fd()), buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil || n == 0 {
			return err // the daemon is gone
		}
		var fds []int
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
		var req Request
		pid, pidfd, err := -1, -1, json.Unmarshal(buf[:n], &req)
		if err == nil {
			pid, pidfd, err = forkAt(exe, req, fds)
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
		rep := Reply{PID: pid}
		var rights []byte
		if err != nil {
			rep.Error = err.Error()
		} else {
			rights = unix.UnixRights(pidfd)
		}
		b, _ := json.Marshal(rep)
		err = unix.Sendmsg(int(sock.Fd()), b, rights, nil, 0)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if err != nil {
			return err
		}
	}
}

// ownNetns is the forker's network namespace (the host's).
var ownNetns = -1

// forkAt forks the guest from a thread at the priority it should start
// with: the forker's own, or the normal one for an urgent request (a child
// inherits the nice value of the thread that forks it); and in the network
// namespace it should have, for a request that brings one (a child
// inherits the namespaces of the thread that forks it).
func forkAt(exe *os.File, req Request, fds []int) (int, int, error) {
	if !req.Urgent && !req.NetNS {
		return forkGuest(exe, req, fds)
	}
	type forked struct {
		pid, pidfd int
		err        error
	}
	ch := make(chan forked, 1)
	go func() {
		goruntime.LockOSThread()
		if req.Urgent {
			unix.Setpriority(unix.PRIO_PROCESS, 0, 0) // 0: this thread
		}
		if req.NetNS {
			if len(fds) == 0 {
				goruntime.UnlockOSThread()
				ch <- forked{-1, -1, fmt.Errorf("fork request carries no network namespace")}
				return
			}
			if err := unix.Setns(fds[len(fds)-1], unix.CLONE_NEWNET); err != nil {
				goruntime.UnlockOSThread()
				ch <- forked{-1, -1, fmt.Errorf("entering the guest's network namespace: %w", err)}
				return
			}
		}
		pid, pidfd, err := forkGuest(exe, req, fds)
		if req.NetNS {
			if rerr := unix.Setns(ownNetns, unix.CLONE_NEWNET); rerr != nil {
				// The thread stays locked and ends with the goroutine,
				// never to fork a guest into that namespace again.
				ch <- forked{pid, pidfd, err}
				return
			}
		}
		unix.Setpriority(unix.PRIO_PROCESS, 0, Nice)
		goruntime.UnlockOSThread()
		ch <- forked{pid, pidfd, err}
	}()
	f := <-ch
	return f.pid, f.pidfd, f.err
}

// forkGuest starts a guest in new user, mount, pid, net (unless the
// request brings one), ipc and uts namespaces with root mapped to
// req.UIDBase.
func forkGuest(exe *os.File, req Request, fds []int) (pid, pidfd int, err error) {
	need := FDCgroup
	if req.UseCgroup {
		need++
	}
	if req.NetNS {
		need++
	}
	if len(fds) != need {
		return -1, -1, fmt.Errorf("fork request carries %d fds, want %d", len(fds), need)
	}
	if req.IDs == 0 {
		return -1, -1, fmt.Errorf("fork request maps no ids")
	}
	pidfd = -1
	flags := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
		unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if req.NetNS {
		flags &^= unix.CLONE_NEWNET // the thread's, which forkAt entered
	}
	sys := &syscall.SysProcAttr{
		Cloneflags:                 flags,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(req.UIDBase), Size: int(req.IDs)}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(req.UIDBase), Size: int(req.IDs)}},
		GidMappingsEnableSetgroups: true,
		// Our host uid (0) is unmapped in the new namespace: become its
		// root before exec, or exec drops every capability.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		Setsid:     true,
		PidFD:      &pidfd,
	}
	if req.UseCgroup {
		sys.UseCgroupFD = true
		sys.CgroupFD = fds[FDCgroup]
	}
	pid, err = syscall.ForkExec(fmt.Sprintf("/proc/self/fd/%d", exe.Fd()), []string{"paddock", GuestVerb}, &syscall.ProcAttr{
		// The guest runs with one P (guest.Run says why). Set before the
		// runtime starts, it never makes the second P, its cache and the
		// thread that serves it, nor stops the world to drop them: 58
		// fewer page faults and 200 KiB less memory per guest.
		// memprofilerate=0: the runtime profiles a process's first
		// allocation whatever the rate (its first cache records rate 0,
		// which never matches the default rate, and a mismatch always
		// samples),
		// before the rate the linker chose (0: nothing in the guest reads
		// the profile) takes effect; set in the environment, read before
		// the heap starts, it spares each guest that stack walk (about
		// 45 µs of CPU under churn). The guest gives its children their
		// own environments, never this one.
		Env:   []string{"GOMAXPROCS=1", "GODEBUG=memprofilerate=0"},
		Files: []uintptr{uintptr(fds[FDStdin]), uintptr(fds[FDLog]), uintptr(fds[FDLog]), uintptr(fds[FDSync]), uintptr(fds[FDListen])},
		Sys:   sys,
	})
	if err != nil {
		return -1, -1, fmt.Errorf("starting guest: %w", err)
	}
	return pid, pidfd, nil
}

// isolateMounts replaces the forker's copy of the host's mount table with
// a minimal root: a read-only tmpfs holding /tmp (where a guest stages its
// root), fresh proc and sysfs instances (the kernel lets a user namespace
// mount proc and sysfs only where one is already fully visible, and /proc
// serves the forker's and guests' /proc/self), and the devices guests
// bind. The host's tree is detached at once, so neither the forker nor a
// guest forked from it holds a host mount: a guest's mount namespace is a
// copy of its forker's, and a copy of the host's would keep every host
// mount that existed at the fork (a loop device, another daemon's disk,
// an operator's mount) alive for as long as the guest waits in a pool,
// whatever the host unmounts meanwhile. A guest's copy of this tree stays
// in its namespace, beneath its sandbox's root (guest's enterRoot): add
// nothing of the host's here.
func isolateMounts() error {
	// The daemon started us in a new mount namespace; nothing done here
	// may reach the host's.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	// Any directory of the host's tree serves as the mount point: the
	// tmpfs becomes the root below.
	const top = "/tmp"
	if err := unix.Mount("tmpfs", top, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=16k"); err != nil {
		return fmt.Errorf("mounting the forker's root: %w", err)
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp"} {
		if err := unix.Mkdir(top+"/"+d, 0o755); err != nil {
			return fmt.Errorf("creating /%s: %w", d, err)
		}
	}
	for _, d := range guestapi.Devices {
		target := top + "/dev/" + d
		fd, err := unix.Open(target, unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_RDONLY, 0o644)
		if err != nil {
			return fmt.Errorf("creating /dev/%s: %w", d, err)
		}
		unix.Close(fd)
		if err := unix.Mount("/dev/"+d, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /dev/%s: %w", d, err)
		}
	}
	// The flags a guest's own proc and sysfs are mounted with, or fewer:
	// a new instance may not be less restricted than the visible one.
	if err := unix.Mount("proc", top+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting proc: %w", err)
	}
	if err := unix.Mount("sysfs", top+"/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting sysfs: %w", err)
	}
	if err := unix.Chdir(top); err != nil {
		return fmt.Errorf("entering the forker's root: %w", err)
	}
	// runc's pivot_root(".", ".") idiom: the old root ends up on top of
	// the new one and is detached right away.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("making the forker's root read-only: %w", err)
	}
	return nil
}

// lowerPriority sets every thread of this process to Nice; threads
// started later inherit it from the one that starts them.
func lowerPriority() {
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, t := range tasks {
		if tid, err := strconv.Atoi(t.Name()); err == nil {
			unix.Setpriority(unix.PRIO_PROCESS, tid, Nice)
		}
	}
}
