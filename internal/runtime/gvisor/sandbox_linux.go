package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// state is what Restore needs to find a sandbox again: runsc's sandbox
// process (the sentry), which every process of the sandbox lives in.
type state struct {
	PID       int             `json:"pid"`
	StartTime uint64          `json:"start_time"`
	UIDBase   uint32          `json:"uid_base"`
	Net       json.RawMessage `json:"net,omitempty"`
}

// Sandbox is a running gvisor sandbox.
type Sandbox struct {
	id      string
	st      state
	socket  string // the guest's control socket on the host
	cg      *cgroup.Group
	done    chan struct{}
	version string

	// mu guards pidFile against use after the watcher closed it: a
	// closed fd number may be reused, and a signal must never reach
	// another process.
	mu      sync.Mutex
	pidFile *os.File // nil once the sentry has exited
	onExit  []func()
	reaped  bool
	// oomBase is the cgroup's OOM kill count when the watch began;
	// exitErr, once the sentry has exited, says why when the OOM killer
	// ended it.
	oomBase uint64
	exitErr error
	// moving is set while the sentry is replaced by one restored from
	// its own checkpoint (renew_linux.go): the exit of the old one
	// closes left and ends nothing; the new one arrives (arrive).
	moving bool
	left   chan struct{}
}

var (
	_ runtime.Instance    = (*Sandbox)(nil)
	_ runtime.ExitWatcher = (*Sandbox)(nil)
	_ runtime.Activating  = (*Sandbox)(nil)
)

// Activate implements runtime.Activating: a gvisor sandbox serves once
// Start returns.
func (s *Sandbox) Activate() {}

// StartErr implements runtime.Activating: once the sentry has exited, why
// it ended, if the OOM killer ended it.
func (s *Sandbox) StartErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitErr
}

// errOOM is why a sandbox the OOM killer ended has ended. Under gVisor
// the sandbox's kernel is one host process, the cgroup's largest: a
// sandbox that reaches its memory limit ends whole, where a native one
// loses the process that allocated.
var errOOM = errors.New("the sandbox ran out of memory: the OOM killer ended it at its memory limit (under gVisor the whole sandbox ends)")

// oomKills is cg's OOM kill count (0 when it cannot be read).
func oomKills(cg *cgroup.Group) uint64 {
	f, err := cg.OpenOOMEvents()
	if err != nil {
		return 0
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return 0
	}
	n, _ := cgroup.ParseOOMKills(b)
	return n
}

// ID implements runtime.Instance.
func (s *Sandbox) ID() string { return s.id }

// State implements runtime.Instance.
func (s *Sandbox) State() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, _ := json.Marshal(s.st)
	return b
}

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

// Kill implements runtime.Instance: SIGKILL to the sentry ends every
// process of the sandbox (its gofer exits with it). A frozen cgroup is
// thawed first, or the signal would wait for the thaw.
func (s *Sandbox) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidFile == nil {
		return nil
	}
	s.cg.Thaw()
	err := unix.PidfdSendSignal(int(s.pidFile.Fd()), unix.SIGKILL, nil, 0)
	if err == unix.ESRCH {
		return nil
	}
	return err
}

// Freeze implements runtime.Instance: the cgroup freezer stops the sentry
// (and with it every process of the sandbox) in place.
func (s *Sandbox) Freeze(ctx context.Context) error { return s.cg.Freeze(ctx) }

// Thaw implements runtime.Instance.
func (s *Sandbox) Thaw() error { return s.cg.Thaw() }

// Update implements runtime.Instance.
func (s *Sandbox) Update(res api.Resources) error { return s.cg.Update(limitsOf(res)) }

// Info implements runtime.Instance.
func (s *Sandbox) Info() api.RuntimeInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return api.RuntimeInfo{Name: Name, Version: s.version, HostPID: s.st.PID, UIDBase: s.st.UIDBase, Cgroup: s.cg.Path()}
}

// watch takes ownership of pidfd and closes done when the sentry exits.
// It is not our child (runsc run --detach left it), so its parent reaps
// it.
func (s *Sandbox) watch(pidfd int) error {
	f := os.NewFile(uintptr(pidfd), "pidfd")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	s.mu.Lock()
	s.pidFile = f
	s.mu.Unlock()
	go func() {
		// The pidfd turns readable when the process exits; Go's poller
		// waits for that without a thread per sandbox.
		if err := rc.Read(func(fd uintptr) bool {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(fds, 0)
			return n > 0
		}); err != nil && !errors.Is(err, os.ErrClosed) {
			rc.Control(func(fd uintptr) {
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				for {
					if _, err := unix.Poll(fds, -1); err != unix.EINTR {
						return
					}
				}
			})
		}
		// Before anyone hears of the exit, and before the cgroup goes.
		oom := oomKills(s.cg) > s.oomBase
		s.mu.Lock()
		if s.moving {
			f.Close()
			s.pidFile = nil
			close(s.left)
			s.mu.Unlock()
			return
		}
		if oom {
			s.exitErr = errOOM
		}
		f.Close()
		s.pidFile = nil
		s.mu.Unlock()
		s.end()
	}()
	return nil
}

// leave readies s for the replacement of its sentry (renew): the exit
// of the current one, which the caller then brings about, ends no
// sandbox; left is closed once it has exited. Then arrive watches the
// new one, or end says the sandbox has ended.
func (s *Sandbox) leave() (left <-chan struct{}, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidFile == nil || s.moving {
		return nil, errdefs.Conflict("sandbox %s has ended", s.id)
	}
	s.moving, s.left = true, make(chan struct{})
	return s.left, nil
}

// awaiting reports whether s's old sentry has left and the new one has
// not arrived.
func (s *Sandbox) awaiting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.moving && s.pidFile == nil
}

// arrive watches sentry pid, restored after leave, as s's (and the
// first one, made by Runtime.watch).
func (s *Sandbox) arrive(pid int) error {
	pidfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return errdefs.NotFound("sandbox process", strconv.Itoa(pid))
	}
	start, err := runtime.ProcStartTime(pid)
	if err != nil {
		unix.Close(pidfd)
		return errdefs.NotFound("sandbox process", strconv.Itoa(pid))
	}
	s.mu.Lock()
	s.st.PID, s.st.StartTime = pid, start
	s.oomBase = oomKills(s.cg)
	s.moving, s.left = false, nil
	s.mu.Unlock()
	return s.watch(pidfd)
}

// end tells those waiting for s's end of it: once its sentry has
// exited (watch), or when its replacement did not arrive (renew).
func (s *Sandbox) end() {
	s.mu.Lock()
	s.moving = false
	onExit := s.onExit
	s.onExit, s.reaped = nil, true
	s.mu.Unlock()
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	for _, f := range onExit {
		go f()
	}
}

// stopWatching ends a watch of a process that turned out not to be the
// sandbox's (Restore's start time check).
func (s *Sandbox) stopWatching() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidFile != nil {
		s.pidFile.Close() // the watcher's Read returns
	}
}

// OnExit implements runtime.ExitWatcher.
func (s *Sandbox) OnExit(f func()) {
	s.mu.Lock()
	reaped := s.reaped
	if !reaped {
		s.onExit = append(s.onExit, f)
	}
	s.mu.Unlock()
	if reaped {
		go func() {
			<-s.done
			f()
		}()
	}
}
