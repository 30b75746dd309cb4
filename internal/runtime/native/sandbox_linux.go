package native

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/cgroup"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/fdnotify"
	"github.com/paddock-dev/paddock/internal/runtime"
)

// state is what Restore needs to find a sandbox again.
type state struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	UIDBase   uint32 `json:"uid_base"`
	Idmapped  bool   `json:"idmapped"`
	// Net is the network's state for Restore (runtime.NetSetup.State).
	Net json.RawMessage `json:"net,omitempty"`
}

// Sandbox is a running native sandbox: its guest process, control socket
// and cgroup.
type Sandbox struct {
	id     string
	st     state
	socket string
	cg     *cgroup.Group
	done   chan struct{}
	// net is what the network made for it (files, environment), which
	// the sandbox's other containers share (runtime.Spec.Join).
	net runtime.NetSetup

	// active is closed once the sandbox's limits are set and the guest
	// has answered its Activate (at once for a sandbox found running after
	// a restart); activeErr is then why it could not start serving, if it
	// could not. Start does not wait for either: nothing the sandbox runs
	// starts before a Dial, which waits for limited, so the create can
	// answer meanwhile.
	active    chan struct{}
	activeErr error
	// limited is closed once the limits are set (or that failed:
	// limitErr): from then on Dial connects. The guest accepts once
	// activated, so a command's request travels meanwhile.
	limited  chan struct{}
	limitErr error
	// sent is closed once the guest's Activate is written to it (or that
	// failed): from then on the sandbox comes up even if the daemon dies
	// (a restarted one sets its limits), so a create may answer.
	sent chan struct{}
	// activation is the first part of coming up (see Runtime.activate),
	// run once: by Activate for a held start, else by a goroutine of
	// Start, or by the watcher of a held sandbox that died unactivated.
	activation   func()
	activateOnce sync.Once
	// held is activation, for the watcher to run if the guest of a held
	// start dies before Activate (holdActivation); guarded by mu.
	held func()

	// mu guards pidFile against use after the watcher closed it: a closed
	// fd number may be reused, and a signal must never reach another
	// process.
	mu        sync.Mutex
	pidFile   *os.File        // nil once the guest has exited
	exitWatch *fdnotify.Watch // the pidfd's, stopped as it is closed
	// killed: SIGKILL was sent; guarded by mu.
	killed bool

	// mayBeFrozen is set before a freeze and cleared by a thaw that
	// succeeded: a kill thaws the cgroup only then, since a thaw costs a
	// cgroupfs write (0.03-0.3 ms here) on a delete's answer.
	mayBeFrozen atomic.Bool
	// onExit are the functions OnExit was given, run by the watcher;
	// reaped is set when it took them. Guarded by mu.
	onExit []func()
	reaped bool

	// firstAnswer, for a sandbox handed out from a pool, tells the
	// refill that it has answered a first command or was killed
	// (Runtime.handedOut); set before Start returns it, run once by
	// answeredFirst.
	firstAnswer     func()
	firstAnswerOnce sync.Once
	answered        atomic.Bool
}

// answeredFirst runs firstAnswer, once.
func (s *Sandbox) answeredFirst() {
	if s.firstAnswer == nil || s.answered.Load() {
		return
	}
	s.firstAnswerOnce.Do(func() {
		s.answered.Store(true)
		s.firstAnswer()
	})
}

var (
	_ runtime.Instance     = (*Sandbox)(nil)
	_ runtime.Activating   = (*Sandbox)(nil)
	_ runtime.ExitWatcher  = (*Sandbox)(nil)
	_ runtime.Backgrounder = (*Sandbox)(nil)
)

// SetBackground implements runtime.Backgrounder.
func (s *Sandbox) SetBackground(on bool) error {
	select {
	case <-s.limited:
	case <-s.done:
		return errdefs.Conflict("sandbox %s has ended", s.id)
	}
	return s.cg.SetBackground(on)
}

// ID implements runtime.Instance.
func (s *Sandbox) ID() string { return s.id }

// State implements runtime.Instance.
func (s *Sandbox) State() []byte { b, _ := json.Marshal(s.st); return b }

// Done implements runtime.Instance.
func (s *Sandbox) Done() <-chan struct{} { return s.done }

// Dial implements runtime.Instance. It waits until the sandbox's limits
// are set (nothing the sandbox runs can start before), not for the
// guest's answer to its Activate: the guest's listener is open from the
// start and it accepts once activated. A connection made before then
// reports a guest that could not start serving as such, rather than as
// a connection that ends.
func (s *Sandbox) Dial(ctx context.Context) (net.Conn, error) {
	select {
	case <-s.limited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s.limitErr != nil {
		return nil, errdefs.Conflict("sandbox %s did not start: %v", s.id, s.limitErr)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", s.socket)
	if err != nil {
		// A guest that could not activate has gone: say why.
		select {
		case <-s.active:
		case <-ctx.Done():
			return nil, err
		}
		if serr := s.startErr(); serr != nil {
			return nil, serr
		}
		select {
		case <-s.done:
			return nil, errdefs.Conflict("sandbox %s has ended", s.id)
		default:
		}
		return nil, err
	}
	select {
	case <-s.active:
		if err := s.startErr(); err != nil {
			c.Close()
			return nil, err
		}
		if s.firstAnswer != nil && !s.answered.Load() {
			return &activatingConn{Conn: c, sb: s}, nil // for its first read
		}
		return c, nil
	default:
		return &activatingConn{Conn: c, sb: s}, nil
	}
}

// StartErr implements runtime.Activating.
func (s *Sandbox) StartErr() error {
	select {
	case <-s.done:
		<-s.active // the activation ends with the guest
	default:
	}
	return s.startErr() // a limits failure is in activeErr too
}

// startErr is why the guest could not start serving, once that is known
// (nil while it activates, or if it serves).
func (s *Sandbox) startErr() error {
	select {
	case <-s.active:
		if s.activeErr != nil {
			return errdefs.Conflict("sandbox %s did not start: %v", s.id, s.activeErr)
		}
	default:
	}
	return nil
}

// activatingConn is a connection made while its guest activated, or the
// first made to a sandbox handed out from a pool: if it ends before
// anything was read from it, the guest's reason for not serving, if
// any, replaces the bare EOF or reset; its first read is the guest's
// first answer (answeredFirst). It half-closes like
// the unix connection it wraps: a kept guest connection may carry a port
// pipe later, whose half-close must reach the sandbox's TCP peer.
type activatingConn struct {
	net.Conn
	sb   *Sandbox
	read bool
}

// NetConn returns the unix connection it wraps (a lane is handed to the
// guest over it).
func (c *activatingConn) NetConn() net.Conn { return c.Conn }

// CloseWrite half-closes the connection.
func (c *activatingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("%T cannot half-close", c.Conn)
}

func (c *activatingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.read {
		c.read = true
		c.sb.answeredFirst()
	}
	if err != nil && !c.read {
		<-c.sb.active // closed once the activation is over, either way
		if serr := c.sb.startErr(); serr != nil {
			return n, serr
		}
	}
	return n, err
}

// Activate implements runtime.Activating: a held start's activation runs
// here (once), then it waits for sent.
func (s *Sandbox) Activate() {
	s.activateOnce.Do(func() {
		if s.activation != nil { // nil: adopted, already active
			s.activation()
		}
	})
	// What the activation held (its environment, its socket) is not
	// needed for the rest of the sandbox's life.
	s.mu.Lock()
	s.held = nil
	s.mu.Unlock()
	select {
	case <-s.sent:
	case <-s.done:
	}
}

// Kill implements runtime.Instance: SIGKILL to the guest ends its pid
// namespace, and the kernel kills every process in it. A cgroup that may
// be frozen is thawed first: a frozen process does not die until it is
// (v1). A second Kill (a teardown after the removal's) sends nothing.
func (s *Sandbox) Kill() error {
	s.answeredFirst()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pidFile == nil || s.killed {
		return nil
	}
	if s.cg != nil && s.mayBeFrozen.Load() {
		s.Thaw()
	}
	err := unix.PidfdSendSignal(int(s.pidFile.Fd()), unix.SIGKILL, nil, 0)
	if err == unix.ESRCH {
		return nil
	}
	s.killed = err == nil
	return err
}

// Freeze implements runtime.Instance. A sandbox still activating is
// frozen once it is active: frozen halfway, it would never answer.
func (s *Sandbox) Freeze(ctx context.Context) error {
	select {
	case <-s.active:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mayBeFrozen.Store(true)
	return s.cg.Freeze(ctx)
}

// Thaw implements runtime.Instance.
func (s *Sandbox) Thaw() error {
	err := s.cg.Thaw()
	if err == nil {
		s.mayBeFrozen.Store(false)
	}
	return err
}

// Update implements runtime.Instance. It waits until the sandbox's own
// limits are set (activate), so that they cannot overwrite the update.
func (s *Sandbox) Update(res api.Resources) error {
	<-s.active
	return s.cg.Update(limitsOf(res))
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

// exited reports whether the guest has exited.
func (s *Sandbox) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// watch takes ownership of pidfd and closes done when the guest exits,
// reaping it if it is our child. The daemon's one exit watcher waits for
// that (exits).
func (s *Sandbox) watch(pidfd int) error {
	// Blocking: os.NewFile leaves it out of the netpoller, where the
	// watcher's epoll set stands for all of them.
	if err := unix.SetNonblock(pidfd, false); err != nil {
		unix.Close(pidfd)
		return err
	}
	// Held until the watch is recorded: a guest already gone runs reap at
	// once, which must find it.
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pidFile = os.NewFile(uintptr(pidfd), "pidfd")
	w, err := watchExit(s.pidFile, s.reap)
	if err != nil {
		s.pidFile.Close()
		s.pidFile = nil
		return err
	}
	s.exitWatch = w
	return nil
}

// reap is run by the exit watcher once the guest has exited: it reaps
// the guest, closes done and runs what waited for the end.
func (s *Sandbox) reap() {
	s.mu.Lock()
	// Reap it if it is our child; a guest left by an earlier daemon was
	// reparented, and its new parent reaps it.
	var info unix.Siginfo
	unix.Waitid(unix.P_PIDFD, int(s.pidFile.Fd()), &info, unix.WEXITED|unix.WNOHANG, nil)
	s.exitWatch.Stop()
	s.pidFile.Close()
	s.pidFile, s.exitWatch = nil, nil
	held, onExit := s.held, s.onExit
	s.onExit, s.reaped = nil, true
	s.mu.Unlock()
	close(s.done)
	for _, f := range onExit {
		go f()
	}
	if held != nil {
		// Held, and never activated: its socket is closed and its
		// waiters (Dial) told all the same.
		s.activateOnce.Do(held)
	}
}

// OnExit implements runtime.ExitWatcher: the watcher that waits for the
// guest's end anyway runs f, so that the manager parks no goroutine of
// its own per sandbox to wait for it (issue 21).
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

// holdActivation makes a held start's activation (run by Activate) also
// run if the guest dies before Activate: the watcher runs it then, rather
// than a goroutine per sandbox that would wait for the guest's end for
// all of its life (issue 21: what the daemon holds per sandbox).
func (s *Sandbox) holdActivation() {
	s.mu.Lock()
	gone := s.pidFile == nil
	if !gone {
		s.held = s.activation
	}
	s.mu.Unlock()
	if gone {
		go s.activateOnce.Do(s.activation)
	}
}
