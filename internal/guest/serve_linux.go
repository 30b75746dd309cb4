package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"paddock/api"
	"paddock/internal/errdefs"
	"paddock/wire"
)

// serve is the guest's steady state: it reaps every process, forwards
// signals, and serves the daemon's requests on the control socket, forking
// each command on the spawner thread.
func serve(cfg ServeConfig, sp *spawner, syncSock *os.File, oom *os.File) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("guest", os.Getpid())
	lf := os.NewFile(fdListen, "listener")
	ln, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		return fmt.Errorf("opening control listener: %w", err)
	}
	s := newServer(cfg, oom, sp, log)
	go s.reapLoop()
	go s.forwardSignals()

	b, _ := json.Marshal(Ready{Phase: "ready", PID: os.Getpid()})
	syncSock.Write(b)
	syncSock.Close()

	for {
		conn, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			log.Warn("accepting", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.handle(conn)
	}
}

type server struct {
	cfg ServeConfig
	oom *os.File
	sp  *spawner
	log *slog.Logger

	// mu guards procs and is held across fork so that the reaper cannot
	// reap a child before it is in the table.
	mu    sync.Mutex
	procs map[int]*process
	// finished lists retained finished processes, oldest first.
	finished []int
}

type process struct {
	pid     int
	cmd     []string
	started time.Time
	out     *ring
	oomAt   uint64

	mu      sync.Mutex
	stdin   *os.File // nil when closed or never open
	status  *unix.WaitStatus
	exited  chan struct{}
	pumpsWG sync.WaitGroup
}

func newServer(cfg ServeConfig, oom *os.File, sp *spawner, log *slog.Logger) *server {
	if cfg.OutputLimit <= 0 {
		cfg.OutputLimit = 16 << 20
	}
	if cfg.Retain <= 0 {
		cfg.Retain = 256
	}
	return &server{cfg: cfg, oom: oom, sp: sp, log: log, procs: map[int]*process{}}
}

func (s *server) handle(conn net.Conn) {
	defer conn.Close()
	fr := wire.NewReader(conn)
	fw := wire.NewWriter(conn)
	f, err := fr.Read()
	if err != nil {
		return
	}
	if f.Type != wire.Request {
		fw.WriteJSON(wire.Response, Response{Error: apiError(errdefs.Invalid("frame", "expected a request frame"))})
		return
	}
	var req Request
	if err := json.Unmarshal(f.Payload, &req); err != nil {
		fw.WriteJSON(wire.Response, Response{Error: apiError(errdefs.Invalid("request", "%v", err))})
		return
	}
	switch req.Op {
	case OpPing:
		fw.WriteJSON(wire.Response, Response{PID: os.Getpid()})
	case OpStart:
		s.start(conn, fr, fw, req)
	case OpAttach:
		p, err := s.lookup(req.PID)
		if err != nil {
			fw.WriteJSON(wire.Response, Response{Error: apiError(err)})
			return
		}
		fw.WriteJSON(wire.Response, Response{PID: p.pid})
		s.stream(conn, fr, p, req.Offset)
	case OpList:
		fw.WriteJSON(wire.Response, Response{Processes: s.list()})
	case OpSignal, OpInput, OpCloseStdin:
		p, err := s.lookup(req.PID)
		if err == nil {
			err = s.control(p, req)
		}
		fw.WriteJSON(wire.Response, Response{Error: apiError(err), PID: req.PID})
	default:
		if h, ok := extraOps[req.Op]; ok {
			h(s, &opConn{conn: conn, fr: fr, fw: fw}, req)
			return
		}
		fw.WriteJSON(wire.Response, Response{Error: apiError(errdefs.Invalid("op", "unknown op %q", req.Op))})
	}
}

// opConn is a guest connection as an op handler sees it: the request has
// been read; the handler writes one Response frame and then, for streaming
// ops, frames both ways until it is done. The connection is closed after
// the handler returns.
type opConn struct {
	conn net.Conn
	fr   *wire.Reader
	fw   *wire.Writer
}

// respond writes the Response frame: err as an error answer, or resp.
func (c *opConn) respond(resp Response, err error) error {
	if err != nil {
		resp = Response{Error: apiError(err)}
	}
	return c.fw.WriteJSON(wire.Response, resp)
}

// opHandler serves one op.
type opHandler func(s *server, c *opConn, req Request)

// extraOps are the ops beyond processes: files (files_linux.go) and ports
// (ports_linux.go) add theirs here in init functions.
var extraOps = map[string]opHandler{}

func apiError(err error) *api.Error {
	if err == nil {
		return nil
	}
	return &api.Error{Code: errdefs.Code(err), Message: err.Error()}
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

func (s *server) start(conn net.Conn, fr *wire.Reader, fw *wire.Writer, req Request) {

	if req.Start == nil || len(req.Start.Cmd) == 0 {
		fw.WriteJSON(wire.Response, Response{Error: apiError(errdefs.Invalid("cmd", "must not be empty"))})
		return
	}
	p, err := s.spawn(req.Start)
	if errors.Is(err, errdefs.ErrInvalid) {
		fw.WriteJSON(wire.Response, Response{Error: apiError(err)})
		return
	}
	if err != nil {
		// A command that cannot run answers like a shell would: the stream
		// ends at once with 127 (not found) or 126 (not executable).
		code := 126
		if errors.Is(err, errdefs.ErrNotFound) {
			code = 127
		}
		fw.WriteJSON(wire.Response, Response{PID: 0})
		if req.Start.Attach {
			fw.WriteJSON(wire.Exit, api.ExitStatus{ExitCode: code, Error: err.Error()})
		}
		return
	}
	if err := fw.WriteJSON(wire.Response, Response{PID: p.pid}); err != nil || !req.Start.Attach {
		return
	}
	s.stream(conn, fr, p, 0)
}

// stream sends p's output from off until it ends or the client goes away,
// while applying the client's input frames. The process outlives the
// connection.
func (s *server) stream(conn net.Conn, fr *wire.Reader, p *process, off int64) {
	cur := p.out.attach(off)
	defer p.out.detach(cur)
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		defer p.out.wake()
		for {
			f, err := fr.Read()
			if err != nil {
				return
			}
			if err := s.controlFrame(p, f); err != nil {
				s.log.Debug("control frame", "pid", p.pid, "err", err)
			}
		}
	}()
	var hdr [wire.HeaderSize]byte
	for {
		chunks, lost, exit := p.out.next(cur, gone)
		if chunks == nil && exit == nil && lost == 0 {
			select {
			case <-gone:
				return
			default:
				continue
			}
		}
		if lost > 0 {
			b, _ := json.Marshal(map[string]int64{"bytes": lost})
			if err := writeFrame(conn, &hdr, wire.Dropped, b); err != nil {
				return
			}
		}
		for _, c := range chunks {
			if err := writeFrame(conn, &hdr, c.typ, c.data); err != nil {
				return
			}
			p.out.advance(cur, c.off+int64(len(c.data)))
		}
		if exit != nil {
			b, _ := json.Marshal(exit)
			writeFrame(conn, &hdr, wire.Exit, b)
			return
		}
	}
}

// writeFrame writes a header and payload with one writev.
func writeFrame(conn net.Conn, hdr *[wire.HeaderSize]byte, t wire.Type, payload []byte) error {
	for len(payload) > wire.MaxPayload {
		if err := writeFrame(conn, hdr, t, payload[:wire.MaxPayload]); err != nil {
			return err
		}
		payload = payload[wire.MaxPayload:]
	}
	h := wire.AppendFrame(hdr[:0], t, nil)
	h[4], h[5], h[6], h[7] = byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	bufs := net.Buffers{h, payload}
	_, err := bufs.WriteTo(conn)
	return err
}

func (s *server) controlFrame(p *process, f wire.Frame) error {
	switch f.Type {
	case wire.Stdin:
		return s.control(p, Request{Op: OpInput, Data: f.Payload})
	case wire.CloseStdin:
		return s.control(p, Request{Op: OpCloseStdin})
	case wire.Signal:
		var v struct {
			Signal string `json:"signal"`
		}
		if err := json.Unmarshal(f.Payload, &v); err != nil {
			return err
		}
		return s.control(p, Request{Op: OpSignal, Signal: v.Signal})
	}
	return errdefs.Invalid("frame", "unexpected frame type %d", f.Type)
}

func (s *server) control(p *process, req Request) error {
	switch req.Op {
	case OpSignal:
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
	case OpInput:
		p.mu.Lock()
		in := p.stdin
		p.mu.Unlock()
		if in == nil {
			return errdefs.Conflict("stdin of process %d is closed", p.pid)
		}
		_, err := in.Write(req.Data)
		return err
	case OpCloseStdin:
		p.mu.Lock()
		in := p.stdin
		p.stdin = nil
		p.mu.Unlock()
		if in != nil {
			in.Close()
		}
		return nil
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

func (s *server) list() []ProcessInfo {
	s.mu.Lock()
	procs := make([]*process, 0, len(s.procs))
	for _, p := range s.procs {
		procs = append(procs, p)
	}
	s.mu.Unlock()
	sort.Slice(procs, func(i, j int) bool { return procs[i].started.Before(procs[j].started) })
	out := make([]ProcessInfo, 0, len(procs))
	for _, p := range procs {
		end, dropped := p.out.stats()
		info := ProcessInfo{PID: p.pid, Cmd: p.cmd, StartedAt: p.started, OutputBytes: end, DroppedBytes: dropped, Running: true}
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

// spawn forks and execs a command in the sandbox.
func (s *server) spawn(sr *StartRequest) (*process, error) {
	env := mergeEnv(s.cfg.Env, sr.Env)
	cwd := sr.Cwd
	if cwd == "" {
		cwd = s.cfg.Workdir
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, errdefs.Invalid("cwd", "%s is not a directory in the sandbox", cwd)
	}
	cred, home, err := credential(sr.User)
	if err != nil {
		return nil, err
	}
	if home != "" && !hasKey(sr.Env, "HOME") {
		env = mergeEnv(env, []string{"HOME=" + home})
	}
	argv0, err := lookPath(sr.Cmd[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return nil, err
	}
	var stdinR, stdinW *os.File
	if sr.Stdin {
		if stdinR, stdinW, err = os.Pipe(); err != nil {
			return nil, err
		}
	} else if stdinR, err = os.Open(os.DevNull); err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	for _, f := range []*os.File{outW, errW} {
		unix.FcntlInt(f.Fd(), unix.F_SETPIPE_SZ, 1<<20)
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{stdinR.Fd(), outW.Fd(), errW.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true, Credential: cred},
	}
	p := &process{cmd: sr.Cmd, out: newRing(s.cfg.OutputLimit), exited: make(chan struct{}), oomAt: s.oomKills()}

	s.mu.Lock()
	pid, err := s.sp.spawn(argv0, sr.Cmd, attr)
	if err == nil {
		p.pid = pid
		p.started = time.Now()
		s.dropFinishedLocked(pid)
		s.procs[pid] = p
	}
	s.mu.Unlock()
	stdinR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		return nil, fmt.Errorf("starting %s: %w", sr.Cmd[0], err)
	}
	p.stdin = stdinW
	p.pumpsWG.Add(2)
	go s.pump(p, outR, wire.Stdout)
	go s.pump(p, errR, wire.Stderr)
	go s.finish(p)
	return p, nil
}

// drainGrace is how long output is still read after the process exits:
// what it wrote is already in the pipe, and a background child that keeps
// the pipe open must not hold the stream open forever.
const drainGrace = 20 * time.Millisecond

// pumpBufs recycles the pumps' read buffers: fresh memory costs a page
// fault per 4 KiB, which on small VMs is more than a short command's run.
var pumpBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

// pump copies one output pipe into the process's ring.
func (s *server) pump(p *process, r *os.File, t wire.Type) {
	defer p.pumpsWG.Done()
	defer r.Close()
	go func() {
		<-p.exited
		r.SetReadDeadline(time.Now().Add(drainGrace))
	}()
	buf := pumpBufs.Get().(*[]byte)
	defer pumpBufs.Put(buf)
	for {
		select {
		case <-p.exited:
			r.SetReadDeadline(time.Now().Add(drainGrace))
		default:
		}
		n, err := r.Read(*buf)
		if n > 0 {
			p.out.append(t, append([]byte(nil), (*buf)[:n]...))
		}
		if err != nil {
			return
		}
	}
}

// finish waits for the exit status and the output, then closes the ring.
func (s *server) finish(p *process) {
	<-p.exited
	p.pumpsWG.Wait()
	p.mu.Lock()
	ws := *p.status
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.mu.Unlock()
	st := api.ExitStatus{ExitCode: ws.ExitStatus()}
	if ws.Signaled() {
		st.ExitCode = 128 + int(ws.Signal())
		st.Signal = unix.SignalName(ws.Signal())
		if ws.Signal() == unix.SIGKILL && s.oomKills() > p.oomAt {
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
	s.mu.Unlock()
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

func (s *server) oomKills() uint64 {
	if s.oom == nil {
		return 0
	}
	buf := make([]byte, 4096)
	n, err := s.oom.ReadAt(buf, 0)
	if n == 0 && err != nil {
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

// reapLoop reaps every child, ours or orphans reparented to us as PID 1.
func (s *server) reapLoop() {
	ch := make(chan os.Signal, 64)
	signal.Notify(ch, unix.SIGCHLD)
	for range ch {
		s.reap()
	}
}

func (s *server) reap() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		p, ok := s.procs[pid]
		if !ok {
			continue
		}
		p.mu.Lock()
		if p.status == nil {
			p.status = &ws
			close(p.exited)
		}
		p.mu.Unlock()
	}
}

// forwardSignals passes the signals PID 1 receives on to every process it
// started (PID 1 has no default action for them).
func (s *server) forwardSignals() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2)
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

func credential(name string) (*syscall.Credential, string, error) {
	if name == "" || name == "root" || name == "0" {
		return nil, "/root", nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return nil, "", errdefs.Invalid("user", "unknown user %q", name)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	cred := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	if gids, err := u.GroupIds(); err == nil {
		for _, g := range gids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				cred.Groups = append(cred.Groups, uint32(n))
			}
		}
	}
	return cred, u.HomeDir, nil
}

// lookPath finds an executable the way execvp does, in the sandbox.
func lookPath(name, path, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := executable(p); err != nil {
			return "", err
		}
		return p, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, name)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: %s: executable file not found in $PATH", errdefs.ErrNotFound, name)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%w: %s: no such file or directory", errdefs.ErrNotFound, p)
		}
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s: permission denied", p)
	}
	return nil
}

// mergeEnv returns base with over's keys replaced or added.
func mergeEnv(base, over []string) []string {
	out := make([]string, 0, len(base)+len(over))
	idx := map[string]int{}
	for _, kv := range append(append([]string(nil), base...), over...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}

func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, _ := strings.Cut(kv, "="); k == key {
			v = val
		}
	}
	return v
}
