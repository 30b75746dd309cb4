package guest

import (
	"fmt"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// spawner forks every process of the sandbox from one OS thread whose
// credentials are the sandbox's: a forked child inherits the forking
// thread's capability sets and cgroup namespace, not the process's. The
// guest's other threads keep the privileges they need to build and run
// the sandbox; no process the sandbox runs ever had them.
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	// restrict, when set, asks the spawner thread to drop to caps.
	restrict   []string
	noNewPrivs bool
	cgroupNS   bool
	pidsTasks  int
	argv0      string
	argv       []string
	attr       *syscall.ProcAttr
	done       chan spawnResult
}

type spawnResult struct {
	pid int
	err error
}

// sandboxSlack is the timer slack of the sandbox's processes: the
// kernel's default for a normal thread.
const sandboxSlack = 50 * time.Microsecond

func startSpawner() *spawner {
	sp := &spawner{reqs: make(chan spawnReq)}
	go sp.loop()
	return sp
}

func (sp *spawner) loop() {
	// Never unlocked: this thread's credentials differ from the others',
	// so no other goroutine may run on it, and it must die with us.
	runtime.LockOSThread()
	// The processes of the sandbox inherit this thread's timer slack,
	// which may be anything the thread inherited (a runtime thread that
	// sysmon started has sysmon's 2 ms): give them the kernel's default.
	unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(sandboxSlack.Nanoseconds()), 0, 0, 0)
	restricted := false
	for req := range sp.reqs {
		switch {
		case req.restrict != nil:
			err := restrictThread(req.restrict, req.noNewPrivs, req.cgroupNS, req.pidsTasks)
			restricted = err == nil
			req.done <- spawnResult{err: err}
		case !restricted:
			req.done <- spawnResult{err: fmt.Errorf("spawner not restricted yet")}
		default:
			pid, err := syscall.ForkExec(req.argv0, req.argv, req.attr)
			req.done <- spawnResult{pid: pid, err: err}
		}
	}
}

// restrict drops the spawner thread to the sandbox's credentials, and
// with cgroupNS gives it a cgroup namespace of its own. The daemon has put
// the guest in its cgroup by now; pidsTasks, unless -1, is the v1 pids
// tasks file of that cgroup, which the spawner thread alone joins first
// (the guest's process is outside it).
func (sp *spawner) restrict(caps []string, noNewPrivs, cgroupNS bool, pidsTasks int) error {
	done := make(chan spawnResult, 1)
	sp.reqs <- spawnReq{restrict: append([]string{}, caps...), noNewPrivs: noNewPrivs, cgroupNS: cgroupNS, pidsTasks: pidsTasks, done: done}
	return (<-done).err
}

// spawn forks and execs on the spawner thread.
func (sp *spawner) spawn(argv0 string, argv []string, attr *syscall.ProcAttr) (int, error) {
	done := make(chan spawnResult, 1)
	sp.reqs <- spawnReq{argv0: argv0, argv: argv, attr: attr, done: done}
	r := <-done
	return r.pid, r.err
}

func restrictThread(caps []string, noNewPrivs, cgroupNS bool, pidsTasks int) error {
	if pidsTasks >= 0 {
		// "0" is the writing thread. The runtime starts no thread from
		// this one (it is locked: its template thread does), so the
		// group holds this thread and what it forks, no other.
		if _, err := unix.Write(pidsTasks, []byte("0")); err != nil {
			return fmt.Errorf("joining the sandbox's pids group: %w", err)
		}
	}
	if cgroupNS {
		if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
			return fmt.Errorf("unsharing cgroup namespace: %w", err)
		}
	}
	if noNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	return limitCaps(caps)
}
