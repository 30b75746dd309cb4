package guest

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/sysmon"
)

// Adopt is the Go guest taking over a sandbox from the fast guest
// (internal/guestc), which exec'd it in PID 1 for an op it does not
// serve; stateFD holds the guestapi.Handover. The sandbox is prepared
// already and the seccomp filter loaded, so nothing here mounts or makes
// a namespace. It returns only on failure.
func Adopt(stateFD int) error {
	runtime.LockOSThread()
	runtime.GOMAXPROCS(1) // as Run
	_ = sysmon.Settle()
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("setting non-dumpable: %w", err)
	}
	h, err := readHandover(stateFD)
	if err != nil {
		return err
	}
	syscall.CloseOnExec(fdListen)
	sp := startSpawner()
	sigs := notifySignals()
	if h.PidsTasks < 0 {
		// Our threads count against the sandbox's pids limit (v2), as
		// in Prepare.
		spareThreads(8)
	} else {
		syscall.CloseOnExec(h.PidsTasks)
	}
	// The spawner thread joins the sandbox's v1 pids group as in
	// Prepare; it keeps the process's cgroup namespace, which the fast
	// guest made, and its no_new_privs (the filter refuses unshare now).
	err = sp.restrict(h.Caps, false, false, h.PidsTasks)
	if h.PidsTasks >= 0 {
		unix.Close(h.PidsTasks)
	}
	if err != nil {
		return err
	}
	var oom *os.File
	if h.OOMFD >= 0 {
		syscall.CloseOnExec(h.OOMFD)
		oom = os.NewFile(uintptr(h.OOMFD), "oom")
	}
	ctl, err := controlListener("")
	if err != nil {
		return err
	}
	s := newServer(h.Serve, oom, sp, serveLog())
	s.oomSeen = h.OOMSeen
	// The processes are in the table before the reaper starts, which
	// would otherwise take an exit that is theirs.
	for _, hp := range h.Procs {
		s.adoptProc(hp)
	}
	s.start(ctl, sigs)
	// The fast guest's SIGCHLDs went with it: a sweep now reaps what
	// exited meanwhile (orphans reparented to PID 1).
	unix.Kill(os.Getpid(), unix.SIGCHLD)
	for _, hc := range h.Conns {
		if err := s.adoptConn(hc); err != nil {
			s.log.Warn("adopting a connection", "err", err)
		}
	}
	return s.accept()
}

func readHandover(fd int) (*guestapi.Handover, error) {
	f := os.NewFile(uintptr(fd), "handover")
	defer f.Close()
	h, err := guestapi.ReadHandover(f)
	if err != nil {
		return nil, fmt.Errorf("reading the fast guest's handover: %w", err)
	}
	return h, nil
}

// adoptProc takes over a process the fast guest started: its retained
// output, its pipes (read on as the pumps do) and its exit, known or to
// come.
func (s *server) adoptProc(hp guestapi.HandoverProc) {
	// The fast guest keeps what its stream has not sent past the cap (a
	// process that ended held by its reader): the ring takes it all.
	limit := s.cfg.OutputLimit
	var held int64
	for _, c := range hp.Output {
		held += int64(len(c.Data))
	}
	p := &process{
		pid: hp.PID, cmd: hp.Cmd, cwd: hp.Cwd, started: time.Unix(0, hp.StartedNS),
		out: newRingAt(max(limit, held), hp.Dropped), exited: make(chan struct{}),
	}
	for _, c := range hp.Output {
		p.out.append(c.Type, c.Data)
	}
	// outputs are indexed as outputTypes; a closed one stays nil.
	p.outputs = make([]*os.File, 2)
	for i, fd := range []int{hp.Stdout, hp.Stderr} {
		if fd < 0 {
			continue
		}
		syscall.CloseOnExec(fd)
		unix.SetNonblock(fd, true)
		p.outputs[i] = os.NewFile(uintptr(fd), "output")
	}
	s.mu.Lock()
	s.procs[p.pid] = p
	s.mu.Unlock()
	if hp.Exit != nil {
		for _, f := range p.outputs {
			if f != nil {
				f.Close()
			}
		}
		p.outputs = nil
		p.out.close(*hp.Exit)
		s.mu.Lock()
		s.finished = append(s.finished, p.pid)
		s.mu.Unlock()
		return
	}
	for i, f := range p.outputs {
		if f != nil {
			go s.pump(p, f, outputTypes[i])
		}
	}
	// A child of ours (PID 1's, before and after the exec), exited or
	// not: its pidfd says when, and wait4 still finds it if it did.
	pidfd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		pidfd = -1
	}
	go s.await(p, pidfd)
}

// adoptedConn is the connection at descriptor fd, which the fast guest
// left.
func adoptedConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return net.FileConn(f)
}

// adoptConn takes over a control connection, or an exec lane, where the
// fast guest left it.
func (s *server) adoptConn(hc guestapi.HandoverConn) error {
	if hc.Lane != nil {
		return s.adoptLane(hc)
	}
	conn, err := adoptedConn(hc.FD, "conn")
	if err != nil {
		return err
	}
	if !s.ctl.add(conn) {
		conn.Close()
		return nil
	}
	go func() {
		defer s.ctl.remove(conn)
		defer conn.Close()
		c := newOpConn(conn)
		switch {
		case hc.PID != 0:
			p, err := s.lookup(hc.PID)
			if err != nil {
				return
			}
			s.stream(c, p, hc.Offset, hc.Answer)
			if !c.reuse {
				return
			}
		case hc.Release:
			c.awaitRelease()
			if !c.reuse {
				return
			}
		}
		s.serveConn(c, hc.Request)
	}()
	return nil
}
