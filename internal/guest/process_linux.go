package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reaper"
	"github.com/paddock-dev/paddock/wire"
)

// processOps are the ops on processes.
var processOps = map[string]opHandler{
	guestapi.OpPing: func(s *server, c *opConn, req guestapi.Request) {
		c.respond(guestapi.Response{PID: os.Getpid()}, nil)
	},
	guestapi.OpStart: (*server).opStart,
	guestapi.OpAttach: func(s *server, c *opConn, req guestapi.Request) {
		p, err := s.lookup(req.PID)
		if c.respond(guestapi.Response{PID: req.PID}, err) != nil || err != nil {
			return
		}
		s.stream(c, p, req.Offset, nil)
	},
	guestapi.OpList: func(s *server, c *opConn, req guestapi.Request) {
		c.respond(guestapi.Response{Processes: s.list()}, nil)
	},
	guestapi.OpSignal:     (*server).opControl,
	guestapi.OpInput:      (*server).opControl,
	guestapi.OpCloseStdin: (*server).opControl,
	guestapi.OpResize:     (*server).opControl,
}

// process is one command the guest started, and its retained output.
type process struct {
	pid     int
	cmd     []string
	user    string
	cwd     string
	tty     *os.File // the pty master, for a process on a terminal
	started time.Time
	out     *ring
	// outputs are what the pumps read; finish ends their reads at exit.
	outputs []*os.File

	mu       sync.Mutex
	stdin    *os.File // nil when closed or never open (the master for a tty)
	status   *unix.WaitStatus
	timedOut bool
	timer    *time.Timer
	exited   chan struct{}

	// outMu is held across each read of an output and its append to
	// out; drained says finish has read the outputs after the exit, and
	// the pumps are to stop.
	outMu   sync.Mutex
	drained bool
}

func (s *server) lookup(pid int) (*process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.procs[pid]
	if !ok {
		return nil, errdefs.NotFound("process", strconv.Itoa(pid))
	}
	return p, nil
}

func (s *server) opStart(c *opConn, req guestapi.Request) {
	if req.Start == nil || len(req.Start.Cmd) == 0 {
		c.respond(guestapi.Response{}, errdefs.Invalid("cmd", "must not be empty"))
		return
	}
	p, err := s.spawn(req.Start)
	if errors.Is(err, errdefs.ErrInvalid) {
		c.respond(guestapi.Response{}, err)
		return
	}
	if err != nil && !req.Start.Attach {
		c.respond(guestapi.Response{}, errdefs.Invalid("cmd", "%v", err))
		return
	}
	if err != nil {
		c.respond(guestapi.Response{}, nil)
		if c.fw.WriteJSON(wire.Exit, cannotRun(err)) == nil {
			c.awaitRelease()
		}
		return
	}
	if !req.Start.Attach {
		c.respond(guestapi.Response{PID: p.pid}, nil)
		return
	}
	b, _ := json.Marshal(guestapi.Response{PID: p.pid})
	s.stream(c, p, 0, wire.AppendFrame(nil, wire.Response, b))
}

// cannotRun is the exit status of a command that could not be started:
// as a shell answers, 127 (not found) or 126 (not executable).
func cannotRun(err error) api.ExitStatus {
	code := 126
	if errors.Is(err, errdefs.ErrNotFound) {
		code = 127
	}
	return api.ExitStatus{ExitCode: code, Error: err.Error()}
}

// startHold is how long an attached start's answer waits for the
// command's first output or its exit, to travel with them: a short
// command's answer, output and exit status then reach the daemon, and the
// daemon's client, in one write each, and nothing else is woken while the
// command runs.
const startHold = 5 * time.Millisecond

// holdAnswer returns a channel that closes after startHold (waking p's
// output readers), and the func that stops its timer.
func holdAnswer(p *process) (chan struct{}, func() bool) {
	held := make(chan struct{})
	t := time.AfterFunc(startHold, func() {
		close(held)
		p.out.wake()
	})
	return held, t.Stop
}

func (s *server) opControl(c *opConn, req guestapi.Request) {
	p, err := s.lookup(req.PID)
	if err == nil {
		err = s.control(p, req)
	}
	c.respond(guestapi.Response{PID: req.PID}, err)
}

// stream sends p's output from off until it ends or the client goes away,
// while applying the client's input frames. The process outlives the
// connection. answer, if set, is an encoded Response frame still to send:
// it goes with the first output or the exit, or alone after startHold.
func (s *server) stream(c *opConn, p *process, off int64, answer []byte) {
	cur := p.out.attach(off)
	defer p.out.detach(cur)
	var held chan struct{} // closed after startHold while answer waits
	if answer != nil {
		var stop func() bool
		held, stop = holdAnswer(p)
		defer stop()
	}
	gone := make(chan struct{})
	released := false // read once gone is closed
	go func() {
		defer close(gone)
		defer p.out.wake()
		for {
			f, err := c.fr.Read()
			if err != nil {
				return
			}
			if f.Type == wire.Release {
				released = true
				return
			}
			if err := s.controlFrame(p, f); err != nil {
				s.log.Debug("control frame", "pid", p.pid, "err", err)
			}
		}
	}()
	fw := streamWriter{conn: c.conn, pending: answer}
	if s.pour(&fw, p, cur, gone, held, nil) {
		s.refillOutPipes()
		// The client releases the connection for its next request, or
		// closes it.
		<-gone
		c.reuse = released
	}
}

// pour writes p's output from cursor cur with fw until the exit frame is
// written (it reports true) or a write fails or cancel is closed. While
// fw holds a pending answer, held closing makes it go out alone. sent, if
// set, is told each frame written, after it went out.
func (s *server) pour(fw *streamWriter, p *process, cur *cursor, cancel <-chan struct{}, held chan struct{}, sent func(t wire.Type, payload []byte)) bool {
	if sent == nil {
		sent = func(wire.Type, []byte) {}
	}
	for {
		hold := held
		if fw.pending == nil {
			hold = nil
		}
		chunks, lost, exit := p.out.next(cur, cancel, hold)
		if chunks == nil && exit == nil && lost == 0 {
			select {
			case <-cancel:
				return false
			case <-hold:
				if fw.flush() != nil {
					return false
				}
				sent(0, nil)
			default:
			}
			continue
		}
		if lost > 0 {
			b, _ := json.Marshal(map[string]int64{"bytes": lost})
			if err := fw.write(wire.Dropped, b); err != nil {
				return false
			}
			sent(wire.Dropped, b)
		}
		for _, ch := range chunks {
			if err := fw.write(ch.typ, ch.data); err != nil {
				return false
			}
			p.out.advance(cur, ch.off+int64(len(ch.data)))
			sent(ch.typ, ch.data)
		}
		if exit != nil {
			b, _ := json.Marshal(exit)
			if fw.write(wire.Exit, b) != nil {
				return false
			}
			sent(wire.Exit, b)
			return true
		}
	}
}

// streamWriter writes a stream's frames to the daemon, the first
// together with pending bytes if there are any.
type streamWriter struct {
	conn    net.Conn
	hdr     [wire.HeaderSize]byte
	pending []byte
}

func (w *streamWriter) write(t wire.Type, payload []byte) error {
	err := writeFrameAfter(w.conn, w.pending, &w.hdr, t, payload)
	w.pending = nil
	return err
}

// flush writes the pending bytes alone.
func (w *streamWriter) flush() error {
	if w.pending == nil {
		return nil
	}
	_, err := w.conn.Write(w.pending)
	w.pending = nil
	return err
}

// writeFrame writes a header and payload with one writev.
func writeFrame(conn net.Conn, hdr *[wire.HeaderSize]byte, t wire.Type, payload []byte) error {
	return writeFrameAfter(conn, nil, hdr, t, payload)
}

// writeFrameAfter writes before (if any), then a frame, in one writev
// (more than one for a payload past wire.MaxPayload).
func writeFrameAfter(conn net.Conn, before []byte, hdr *[wire.HeaderSize]byte, t wire.Type, payload []byte) error {
	for len(payload) > wire.MaxPayload {
		if err := writeFrameAfter(conn, before, hdr, t, payload[:wire.MaxPayload]); err != nil {
			return err
		}
		before, payload = nil, payload[wire.MaxPayload:]
	}
	h := wire.AppendFrame(hdr[:0], t, nil)
	n := len(payload)
	h[4], h[5], h[6], h[7] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	bufs := net.Buffers{h, payload}
	if before != nil {
		bufs = net.Buffers{before, h, payload}
	}
	_, err := bufs.WriteTo(conn)
	return err
}

func (s *server) controlFrame(p *process, f wire.Frame) error {
	switch f.Type {
	case wire.Stdin:
		return s.control(p, guestapi.Request{Op: guestapi.OpInput, Data: f.Payload})
	case wire.CloseStdin:
		return s.control(p, guestapi.Request{Op: guestapi.OpCloseStdin})
	case wire.Signal:
		var v api.SignalRequest
		if err := json.Unmarshal(f.Payload, &v); err != nil {
			return err
		}
		return s.control(p, guestapi.Request{Op: guestapi.OpSignal, Signal: v.Signal})
	case wire.Resize:
		var v api.TTY
		if err := json.Unmarshal(f.Payload, &v); err != nil {
			return err
		}
		return s.control(p, guestapi.Request{Op: guestapi.OpResize, TTY: &v})
	}
	return errdefs.Invalid("frame", "unexpected frame type %d", f.Type)
}

// eot is what closing a terminal's input means: ^D at the start of a line.
var eot = []byte{4}

func (s *server) control(p *process, req guestapi.Request) error {
	switch req.Op {
	case guestapi.OpSignal:
		sig, err := parseSignal(req.Signal)
		if err != nil {
			return err
		}
		// Each process leads its own session; signal the group so that a
		// shell's children get it too.
		if err := unix.Kill(-p.pid, sig); err != nil {
			if err := unix.Kill(p.pid, sig); err != nil && err != unix.ESRCH {
				return fmt.Errorf("signalling %d: %w", p.pid, err)
			}
		}
		return nil
	case guestapi.OpInput:
		p.mu.Lock()
		in := p.stdin
		p.mu.Unlock()
		if in == nil {
			return errdefs.Conflict("stdin of process %d is closed", p.pid)
		}
		_, err := in.Write(req.Data)
		return err
	case guestapi.OpCloseStdin:
		p.mu.Lock()
		in := p.stdin
		if p.tty == nil {
			p.stdin = nil
		}
		p.mu.Unlock()
		switch {
		case in == nil:
		case p.tty != nil:
			// The master stays open: it carries the output too.
			in.Write(eot)
		default:
			in.Close()
		}
		return nil
	case guestapi.OpResize:
		if p.tty == nil {
			return errdefs.Conflict("process %d has no terminal", p.pid)
		}
		if req.TTY == nil || req.TTY.Cols == 0 || req.TTY.Rows == 0 {
			return errdefs.Invalid("tty", "cols and rows must be positive")
		}
		return pty.Setsize(p.tty, &pty.Winsize{Cols: req.TTY.Cols, Rows: req.TTY.Rows})
	}
	return errdefs.Invalid("op", "unknown op %q", req.Op)
}

// parseSignal accepts "TERM", "SIGTERM", "sigterm" or "15".
func parseSignal(name string) (unix.Signal, error) {
	if n, err := strconv.Atoi(name); err == nil {
		if n <= 0 || n > 64 {
			return 0, errdefs.Invalid("signal", "%d is out of range", n)
		}
		return unix.Signal(n), nil
	}
	up := strings.ToUpper(name)
	if !strings.HasPrefix(up, "SIG") {
		up = "SIG" + up
	}
	if sig := unix.SignalNum(up); sig != 0 {
		return sig, nil
	}
	return 0, errdefs.Invalid("signal", "unknown signal %q", name)
}

func (s *server) list() []guestapi.ProcessInfo {
	s.mu.Lock()
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	sort.Slice(procs, func(i, j int) bool { return procs[i].started.Before(procs[j].started) })
	out := make([]guestapi.ProcessInfo, 0, len(procs))
	for _, p := range procs {
		end, dropped := p.out.stats()
		info := guestapi.ProcessInfo{
			PID: p.pid, Cmd: p.cmd, User: p.user, Cwd: p.cwd, TTY: p.tty != nil,
			StartedAt: p.started, OutputBytes: end, DroppedBytes: dropped, Running: true,
		}
		p.out.mu.Lock()
		if p.out.exit != nil {
			st := *p.out.exit
			info.Exit = &st
			info.Running = false
		}
		p.out.mu.Unlock()
		out = append(out, info)
	}
	return out
}

// stdio is a process's side of its standard streams and our side of them.
type stdio struct {
	child  [3]int     // the child's 0, 1, 2; closed here once it runs
	stdin  *os.File   // ours: write end of stdin, or the pty master
	output []*os.File // ours: what the pumps read (stdout, stderr / the master)
	tty    *os.File
}

// devNull is the stdin of processes without one; opened once.
var devNull = sync.OnceValues(func() (int, error) {
	return unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
})

func (io *stdio) closeChild() {
	null, _ := devNull()
	seen := map[int]bool{null: true}
	for _, fd := range io.child {
		if fd > 0 && !seen[fd] {
			seen[fd] = true
			unix.Close(fd)
		}
	}
}

func (io *stdio) closeAll() {
	io.closeChild()
	if io.stdin != nil {
		io.stdin.Close()
	}
	for _, f := range io.output {
		if f != io.stdin {
			f.Close()
		}
	}
}

// ourEnd wraps our end of a pipe for Go's poller: non-blocking, so that
// reads and writes wait in the netpoller and deadlines work. The child's
// end stays blocking.
func ourEnd(fd int, name string) *os.File {
	unix.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), name)
}

// pipes makes pipes for stdin (or /dev/null), stdout and stderr; out, if
// set, is a stdout and stderr pair made beforehand.
func pipes(withStdin bool, out *outPipes) (*stdio, error) {
	io := &stdio{}
	if withStdin {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			out.close()
			return nil, err
		}
		io.child[0], io.stdin = p[0], ourEnd(p[1], "stdin")
	} else {
		null, err := devNull()
		if err != nil {
			out.close()
			return nil, err
		}
		io.child[0] = null
	}
	if out == nil {
		var err error
		if out, err = newOutPipes(); err != nil {
			io.closeAll()
			return nil, err
		}
	}
	io.child[1], io.child[2] = out.child[0], out.child[1]
	io.output = []*os.File{out.ours[0], out.ours[1]}
	return io, nil
}

// outPipes is a stdout and stderr pair: the child's write ends and ours.
type outPipes struct {
	child [2]int
	ours  [2]*os.File
}

func newOutPipes() (*outPipes, error) {
	out := &outPipes{child: [2]int{-1, -1}}
	for i := range 2 {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			out.close()
			return nil, err
		}
		// A larger pipe means fewer wake-ups for a chatty process.
		unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20)
		out.child[i], out.ours[i] = p[1], ourEnd(p[0], "output")
	}
	return out, nil
}

func (out *outPipes) close() {
	if out == nil {
		return
	}
	for i := range 2 {
		if out.child[i] >= 0 {
			unix.Close(out.child[i])
		}
		if out.ours[i] != nil {
			out.ours[i].Close()
		}
	}
}

// takeOutPipes returns the spare stdout and stderr pair, if one is made.
func (s *server) takeOutPipes() *outPipes {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	out := s.spare
	s.spare = nil
	return out
}

// refillOutPipes makes the next process's stdout and stderr pair: eight
// system calls off the next exec's way. An attached start calls it once
// its exit frame is sent, not while the command runs, where it took the
// CPU a short command needed (25-35 µs of the round trip); a detached
// start as soon as its process is forked.
func (s *server) refillOutPipes() {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare != nil {
		return
	}
	if out, err := newOutPipes(); err == nil {
		s.spare = out
	}
}

// terminal makes a pseudo-terminal of the given size; the child gets the
// slave as its stdin, stdout and stderr, owned by uid.
func terminal(size *api.TTY, cred *syscall.Credential) (*stdio, error) {
	master, slave, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("opening a pseudo-terminal: %w", err)
	}
	if err := pty.Setsize(master, &pty.Winsize{Cols: size.Cols, Rows: size.Rows}); err != nil {
		master.Close()
		slave.Close()
		return nil, fmt.Errorf("sizing the terminal: %w", err)
	}
	if cred != nil {
		unix.Fchown(int(slave.Fd()), int(cred.Uid), 5) // group tty
	}
	// The slave's fd is handed to the child and closed here afterwards.
	fd, err := unix.Dup(int(slave.Fd()))
	slave.Close()
	if err != nil {
		master.Close()
		return nil, err
	}
	unix.CloseOnExec(fd)
	return &stdio{child: [3]int{fd, fd, fd}, stdin: master, output: []*os.File{master}, tty: master}, nil
}

// spawn forks and execs a command in the sandbox.
func (s *server) spawn(sr *guestapi.StartRequest) (*process, error) {
	cwd := sr.Cwd
	if cwd == "" {
		cwd = s.cfg.Workdir
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, errdefs.Invalid("cwd", "%s is not a directory in the sandbox", cwd)
	}
	if sr.TimeoutSeconds < 0 {
		return nil, errdefs.Invalid("timeout_seconds", "must not be negative")
	}
	cred, home, err := credential(sr.User)
	if err != nil {
		return nil, err
	}
	over := sr.Env
	if home != "" && !hasKey(sr.Env, "HOME") {
		over = append([]string{"HOME=" + home}, sr.Env...)
	}
	env := mergeEnv(s.env(), over)
	argv0, err := lookPath(sr.Cmd[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return nil, err
	}
	var std *stdio
	pidfd := -1
	sys := &syscall.SysProcAttr{Setsid: true, Credential: cred, PidFD: &pidfd}
	if sr.TTY != nil {
		if sr.TTY.Cols == 0 || sr.TTY.Rows == 0 {
			return nil, errdefs.Invalid("tty", "cols and rows must be positive")
		}
		if !hasKey(env, "TERM") {
			env = append(env, "TERM=xterm-256color")
		}
		std, err = terminal(sr.TTY, cred)
		sys.Setctty = true
		sys.Ctty = 0
	} else {
		std, err = pipes(sr.Stdin, s.takeOutPipes())
	}
	if err != nil {
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{uintptr(std.child[0]), uintptr(std.child[1]), uintptr(std.child[2])},
		Sys:   sys,
	}
	p := &process{
		cmd: sr.Cmd, user: sr.User, cwd: cwd, tty: std.tty, outputs: std.output,
		out: newRing(s.cfg.OutputLimit), exited: make(chan struct{}),
	}
	s.mu.Lock()
	pid, err := s.sp.spawn(argv0, sr.Cmd, attr)
	if err == nil {
		p.pid = pid
		p.started = time.Now()
		s.dropFinishedLocked(pid)
		s.procs[pid] = p
	}
	s.mu.Unlock()
	std.closeChild()
	if err != nil {
		std.closeAll()
		return nil, fmt.Errorf("starting %s: %w", sr.Cmd[0], err)
	}
	p.stdin = std.stdin
	if sr.TimeoutSeconds > 0 {
		p.mu.Lock()
		p.timer = time.AfterFunc(time.Duration(sr.TimeoutSeconds)*time.Second, func() {
			p.mu.Lock()
			running := p.status == nil
			if running {
				p.timedOut = true
			}
			p.mu.Unlock()
			if running {
				unix.Kill(-p.pid, unix.SIGKILL)
				unix.Kill(p.pid, unix.SIGKILL)
			}
		})
		p.mu.Unlock()
	}
	for i, f := range std.output {
		go s.pump(p, f, outputTypes[i])
	}
	go s.await(p, pidfd)
	if sr.TTY == nil && !sr.Attach {
		s.refillOutPipes()
	}
	return p, nil
}

// outputTypes are the frame types of a process's outputs, in order: a
// terminal's one output is its stdout.
var outputTypes = [2]wire.Type{wire.Stdout, wire.Stderr}

// pump copies one output stream into the process's ring until EOF, or
// until finish has read what the process left in it.
func (s *server) pump(p *process, r *os.File, t wire.Type) {
	defer r.Close()
	rc, err := r.SyscallConn()
	if err != nil {
		return
	}
	// Most commands say little: start small, and take a full-size buffer
	// only once a read fills the small one.
	buf := make([]byte, smallRead)
	defer func() { putChunk(buf) }()
	for done := false; !done; {
		// false: nothing to read yet, wait in the netpoller. An error is
		// the deadline finish sets once it has drained the pipe.
		if rc.Read(func(fd uintptr) bool {
			p.outMu.Lock()
			defer p.outMu.Unlock()
			if p.drained {
				done = true
				return true
			}
			n, err := readFD(fd, buf)
			switch {
			case err == unix.EAGAIN:
				return false
			case n > 0:
				full := n == len(buf)
				buf = p.out.appendRead(t, buf, n)
				if full && len(buf) < chunkSize {
					buf = getChunk()
				}
			default:
				done = true // EOF, or the output failed
			}
			return true
		}) != nil {
			return
		}
	}
}

// readFD reads once, retrying an interrupted read.
func readFD(fd uintptr, buf []byte) (int, error) {
	for {
		n, err := unix.Read(int(fd), buf)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// drainOutputs reads what the exited process left in its outputs, and
// stops the pumps: this runs as soon as the exit is known, so the exit
// status does not wait for the pumps to be scheduled, and a background
// child that keeps a pipe open does not hold the stream open.
func (s *server) drainOutputs(p *process) {
	buf := getChunk()
	p.outMu.Lock()
	for i, f := range p.outputs {
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		rc.Control(func(fd uintptr) { // fails if the pump closed it at EOF
			for {
				n, err := readFD(fd, buf)
				if n <= 0 || err != nil {
					return
				}
				buf = p.out.appendRead(outputTypes[i], buf, n)
			}
		})
	}
	p.drained = true
	p.outMu.Unlock()
	putChunk(buf)
	// A pump still waiting is on a pipe someone else holds open.
	for _, f := range p.outputs {
		f.SetReadDeadline(time.Now())
	}
}

// finish waits for the exit status and the output, then closes the ring.
func (s *server) finish(p *process) {
	<-p.exited
	s.drainOutputs(p)
	p.mu.Lock()
	ws := *p.status
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	timedOut := p.timedOut
	p.mu.Unlock()
	st := api.ExitStatus{ExitCode: ws.ExitStatus(), TimedOut: timedOut}
	if ws.Signaled() {
		st.ExitCode = 128 + int(ws.Signal())
		st.Signal = unix.SignalName(ws.Signal())
		if ws.Signal() == unix.SIGKILL && !timedOut && s.oomKilledSince() {
			st.OOMKilled = true
		}
	}
	p.out.close(st)
	s.mu.Lock()
	s.finished = append(s.finished, p.pid)
	for len(s.finished) > s.cfg.Retain {
		delete(s.procs, s.finished[0])
		s.finished = s.finished[1:]
	}
	s.trimFinishedLocked()
	s.mu.Unlock()
}

// FinishedOutputFactor bounds the output the guest keeps of its finished
// processes together: this many times the per-process limit (64 MiB by
// default), charged to the sandbox's memory like any of its processes'.
// Past it the oldest processes' output goes (their records, exits and
// byte counts stay; an attach gets a dropped frame for it): an agent's
// hundredth large build log must not cost the sandbox its guest.
const FinishedOutputFactor = 4

// trimFinishedLocked drops the oldest finished processes' output while
// the finished processes hold more than their share (FinishedOutputFactor).
func (s *server) trimFinishedLocked() {
	budget := FinishedOutputFactor * s.cfg.OutputLimit
	var total int64
	for _, pid := range s.finished {
		if p := s.procs[pid]; p != nil {
			total += p.out.retained()
		}
	}
	for _, pid := range s.finished {
		if total <= budget {
			return
		}
		if p := s.procs[pid]; p != nil {
			total -= p.out.drop()
		}
	}
}

// dropFinishedLocked forgets a finished process whose pid the kernel has
// handed to a new one.
func (s *server) dropFinishedLocked(pid int) {
	if _, ok := s.procs[pid]; !ok {
		return
	}
	delete(s.procs, pid)
	for i, f := range s.finished {
		if f == pid {
			s.finished = append(s.finished[:i], s.finished[i+1:]...)
			break
		}
	}
}

// oomKilledSince reports whether the sandbox's OOM killer has killed a
// process since it was last asked: a SIGKILL that comes with one is
// reported as an OOM kill. Reading the counter only for SIGKILLed
// processes keeps it off the path of every exec.
func (s *server) oomKilledSince() bool {
	n := s.oomKills()
	s.mu.Lock()
	defer s.mu.Unlock()
	more := n > s.oomSeen
	s.oomSeen = n
	return more
}

func (s *server) oomKills() uint64 {
	oom := s.oom.Load()
	if oom == nil {
		return 0
	}
	buf := make([]byte, 4096)
	n, err := oom.ReadAt(buf, 0)
	if n == 0 && err != nil && err != io.EOF {
		return 0
	}
	for _, line := range strings.Split(string(buf[:n]), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "oom_kill" {
			v, _ := strconv.ParseUint(f[1], 10, 64)
			return v
		}
	}
	return 0
}

// await reaps p when its pidfd says it has exited, then finishes it. The
// wait is in the netpoller, so while the sandbox's commands run the guest
// holds no thread in a blocking syscall: the Go runtime then has nothing
// to watch and leaves the CPUs to the commands. Without a pidfd (an old
// kernel), the SIGCHLD sweep (reaper.Run) reaps it.
func (s *server) await(p *process, pidfd int) {
	if pidfd >= 0 {
		s.reapPidfd(p, pidfd)
	}
	s.finish(p)
}

func (s *server) reapPidfd(p *process, pidfd int) {
	if err := unix.SetNonblock(pidfd, true); err != nil {
		unix.Close(pidfd)
		return
	}
	f := os.NewFile(uintptr(pidfd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	// false: not exited yet, wait for the pidfd to be readable. (The
	// netpoller is edge-triggered: never wait after an exit was missed.)
	rc.Read(func(uintptr) bool {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(p.pid, &ws, unix.WNOHANG, nil)
			switch {
			case err == unix.EINTR:
				continue
			case pid == p.pid:
				s.exited(pid, ws)
				return true
			case err != nil:
				return true // the SIGCHLD sweep reaped it
			}
			return false
		}
	})
}

// exited records a child's exit. spawn holds s.mu from fork until the
// process is in the table, so a child that exits at once is still found.
func (s *server) exited(pid int, ws unix.WaitStatus) {
	s.mu.Lock()
	p, ok := s.procs[pid]
	s.mu.Unlock()
	if !ok {
		return // an orphan, reparented to us: reaping it was all
	}
	p.mu.Lock()
	if p.status == nil {
		p.status = &ws
		close(p.exited)
	}
	p.mu.Unlock()
}

// signals are the channels PID 1's signals arrive on. They are asked for
// when the guest starts, not when it starts serving: each signal.Notify is
// a round trip with the Go runtime's signal-mask thread (two thread
// wakes), and the seven of them, made as the guest began to serve, held
// back a new sandbox's first command by about 1 ms.
type signals struct {
	chld <-chan os.Signal // SIGCHLD, for the reaper
	fwd  <-chan os.Signal // passed on to every process (forwardSignals)
	// relisten has a quiesced guest bind its control socket again
	// (guestapi.RelistenSignal).
	relisten <-chan os.Signal
}

func notifySignals() signals {
	fwd := make(chan os.Signal, 16)
	signal.Notify(fwd, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
	relisten := make(chan os.Signal, 1)
	signal.Notify(relisten, guestapi.RelistenSignal)
	return signals{chld: reaper.Watch(), fwd: fwd, relisten: relisten}
}

// forwardSignals passes the signals PID 1 receives (on ch) on to every
// process it started (PID 1 has no default action for them).
func (s *server) forwardSignals(ch <-chan os.Signal) {
	for sig := range ch {
		s.mu.Lock()
		for pid, p := range s.procs {
			p.mu.Lock()
			running := p.status == nil
			p.mu.Unlock()
			if running {
				unix.Kill(-pid, sig.(unix.Signal))
			}
		}
		s.mu.Unlock()
	}
}
