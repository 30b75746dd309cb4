package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/wire"
)

// The process.Process service, over the guest's process table.

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type ptySize struct {
	Size struct {
		Cols uint32 `json:"cols"`
		Rows uint32 `json:"rows"`
	} `json:"size"`
}

type startRequest struct {
	Process processConfig `json:"process"`
	PTY     *ptySize      `json:"pty"`
	Tag     *string       `json:"tag"`
	Stdin   *bool         `json:"stdin"`
}

// selector names a process by pid or by the tag it was started with.
type selector struct {
	Process struct {
		PID *uint32 `json:"pid"`
		Tag *string `json:"tag"`
	} `json:"process"`
}

type processEvent struct {
	Event eventBody `json:"event"`
}

type eventBody struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *struct{}   `json:"keepalive,omitempty"`
}

type startEvent struct {
	PID uint32 `json:"pid"`
}

// dataEvent holds one of stdout, stderr or pty; []byte marshals as
// base64, as proto3 JSON carries bytes.
type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	PTY    []byte `json:"pty,omitempty"`
}

type endEvent struct {
	ExitCode int     `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

func toTTY(p *ptySize) (*api.TTY, error) {
	if p == nil {
		return nil, nil
	}
	if p.Size.Cols == 0 || p.Size.Rows == 0 || p.Size.Cols > 65535 || p.Size.Rows > 65535 {
		return nil, errdefs.Invalid("pty.size", "cols and rows must be 1 to 65535")
	}
	return &api.TTY{Cols: uint16(p.Size.Cols), Rows: uint16(p.Size.Rows)}, nil
}

// guestOf returns the guest of the call's sandbox (resuming it if it is
// paused with auto-resume).
func (s *Server) guestOf(r *http.Request) (*guestapi.Client, error) {
	return s.mgr.Guest(r.Context(), sandboxID(r))
}

func (s *Server) processStart(w http.ResponseWriter, r *http.Request) {
	var req startRequest
	st, err := openStream(w, r, &req)
	if err == nil {
		err = s.startProcess(w, r, st, &req)
	}
	if err != nil {
		st.end(s, r, err)
	}
}

// startProcess starts the process and relays its events; an error is
// returned only before the stream began.
func (s *Server) startProcess(w http.ResponseWriter, r *http.Request, st *stream, req *startRequest) error {
	user, err := userOf(r)
	if err != nil {
		return err
	}
	p := req.Process
	if p.Cmd == "" {
		return errdefs.Invalid("process.cmd", "must name a command")
	}
	argv := append([]string{p.Cmd}, p.Args...)
	for i, a := range argv {
		if strings.ContainsRune(a, 0) {
			return errdefs.Invalid("process.args", "argument %d contains a NUL byte", i)
		}
	}
	if err := reqcheck.Env("process.envs", p.Envs); err != nil {
		return err
	}
	tty, err := toTTY(req.PTY)
	if err != nil {
		return err
	}
	cwd := homeOf(user)
	if p.Cwd != nil && *p.Cwd != "" {
		cwd = resolve(user, *p.Cwd)
	}
	env := append([]string{"USER=" + user, "LOGNAME=" + user}, guestapi.EnvList(p.Envs)...)
	// Older SDKs leave stdin unset and expect it open.
	stdin := req.Stdin == nil || *req.Stdin || tty != nil
	start := &guestapi.StartRequest{
		Cmd: argv, Env: env, Cwd: cwd, User: user, TTY: tty, Stdin: stdin,
		TimeoutSeconds: lifetime(r),
	}
	return s.relayProcess(w, r, st, processStream{start: start}, func(pid int) {
		if req.Tag != nil && *req.Tag != "" {
			s.setTag(sandboxID(r), *req.Tag, uint32(pid))
		}
	})
}

// lifetime reads Connect-Timeout-Ms, which E2B's SDKs use as the
// process's lifetime: the process is killed when it is up, whether or not
// anyone is still attached.
func lifetime(r *http.Request) int64 {
	ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return (ms + 999) / 1000
}

func (s *Server) processConnect(w http.ResponseWriter, r *http.Request) {
	var req selector
	st, err := openStream(w, r, &req)
	if err == nil {
		err = s.connectProcess(w, r, st, &req)
	}
	if err != nil {
		st.end(s, r, err)
	}
}

// connectProcess attaches to a process's output from now on, as envd's
// Connect does (output already sent is not replayed).
func (s *Server) connectProcess(w http.ResponseWriter, r *http.Request, st *stream, req *selector) error {
	pid, err := s.pidOf(r, req)
	if err != nil {
		return err
	}
	gc, err := s.guestOf(r)
	if err != nil {
		return err
	}
	pi, err := gc.Process(r.Context(), pid)
	if err != nil {
		return err
	}
	return s.relayProcess(w, r, st, processStream{pid: pid, offset: pi.OutputBytes, tty: pi.TTY}, nil)
}

// processStream is the guest call whose stream relayProcess relays: an
// attached start, or (start nil) an attach to process pid from offset.
type processStream struct {
	start  *guestapi.StartRequest
	pid    int
	offset int64
	tty    bool // the attached process has a terminal
}

// relayProcess makes a streaming guest call and turns its frames into
// process events: start, data, keepalives, end. If the sandbox dies
// under the stream, the connection is dropped without an end, which the
// SDKs answer with a /health probe (502: the sandbox is gone).
func (s *Server) relayProcess(w http.ResponseWriter, r *http.Request, st *stream, call processStream, started func(pid int)) error {
	id := sandboxID(r)
	gc, err := s.guestOf(r)
	if err != nil {
		return err
	}
	defer s.mgr.Busy(id)()
	done, err := s.mgr.Done(r.Context(), id)
	if err != nil {
		return err
	}
	pid, tty := call.pid, call.tty
	var conn *guestapi.Conn
	if call.start != nil {
		pid, conn, err = gc.StartAttached(r.Context(), call.start)
		tty = call.start.TTY != nil
	} else {
		conn, err = gc.Attach(r.Context(), call.pid, call.offset)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(r.Context(), func() { conn.Conn.Close() })
	defer stop()
	if started != nil {
		started(pid)
	}
	if err := st.send(processEvent{Event: eventBody{Start: &startEvent{PID: uint32(pid)}}}); err != nil {
		return nil
	}
	defer st.keepalive(keepaliveInterval(r), processEvent{Event: eventBody{Keepalive: &struct{}{}}})()
	for {
		f, err := conn.Frames.Read()
		if err != nil {
			if r.Context().Err() != nil {
				return nil
			}
			if sandboxGone(done) {
				panic(http.ErrAbortHandler)
			}
			st.end(s, r, &rpcError{Code: "unavailable", Message: "lost the connection to the sandbox"})
			return nil
		}
		var ev eventBody
		switch f.Type {
		case wire.Stdout:
			if tty {
				ev.Data = &dataEvent{PTY: f.Payload}
			} else {
				ev.Data = &dataEvent{Stdout: f.Payload}
			}
		case wire.Stderr:
			ev.Data = &dataEvent{Stderr: f.Payload}
		case wire.Exit:
			var es api.ExitStatus
			json.Unmarshal(f.Payload, &es)
			if es.Error == "sandbox ended" {
				panic(http.ErrAbortHandler)
			}
			if st.write(processEvent{Event: eventBody{End: endOf(es)}}, false) == nil {
				st.end(s, r, nil)
			}
			return nil
		case wire.Error:
			var e api.Error
			json.Unmarshal(f.Payload, &e)
			st.end(s, r, fmt.Errorf("%w: %s", categoryOf(e.Code), e.Message))
			return nil
		default:
			continue
		}
		if st.write(processEvent{Event: ev}, conn.Frames.Buffered() == 0) != nil {
			return nil
		}
	}
}

// sandboxGone reports whether the sandbox ended, waiting briefly: a
// guest connection broken by a kill races with the pidfd saying so.
func sandboxGone(done <-chan struct{}) bool {
	t := time.NewTimer(500 * time.Millisecond)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func categoryOf(code string) error {
	if err := errdefs.FromCode(code); err != nil {
		return err
	}
	return errdefs.New(errdefs.ErrUnavailable, "guest error")
}

// endOf is the end event of an exit status, worded as Go's
// os.ProcessState (which envd reports): "exit status N" or "signal: killed".
func endOf(es api.ExitStatus) *endEvent {
	e := &endEvent{ExitCode: es.ExitCode, Exited: es.Signal == "", Status: fmt.Sprintf("exit status %d", es.ExitCode)}
	if es.Signal != "" {
		e.ExitCode = -1
		e.Status = "signal: " + signalWord(es.Signal)
	}
	if es.Error != "" {
		msg := es.Error
		e.Error = &msg
	}
	return e
}

func signalWord(sig string) string {
	switch sig {
	case "SIGKILL":
		return "killed"
	case "SIGTERM":
		return "terminated"
	case "SIGINT":
		return "interrupt"
	case "SIGHUP":
		return "hangup"
	case "SIGPIPE":
		return "broken pipe"
	}
	return strings.ToLower(strings.TrimPrefix(sig, "SIG"))
}

func (s *Server) setTag(id, tag string, pid uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tags[id] == nil {
		s.tags[id] = map[string]uint32{}
	}
	s.tags[id][tag] = pid
}

// pidOf resolves a selector.
func (s *Server) pidOf(r *http.Request, sel *selector) (int, error) {
	switch {
	case sel.Process.PID != nil:
		if *sel.Process.PID == 0 {
			return 0, errdefs.Invalid("process.pid", "must be positive")
		}
		return int(*sel.Process.PID), nil
	case sel.Process.Tag != nil:
		s.mu.Lock()
		pid, ok := s.tags[sandboxID(r)][*sel.Process.Tag]
		s.mu.Unlock()
		if !ok {
			return 0, errdefs.NotFound("process with tag", *sel.Process.Tag)
		}
		return int(pid), nil
	}
	return 0, errdefs.Invalid("process", "names no pid or tag")
}

type processInfo struct {
	Config processConfig `json:"config"`
	PID    uint32        `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

func (s *Server) processList(r *http.Request, _ *struct{}) (any, error) {
	gc, err := s.guestOf(r)
	if err != nil {
		return nil, err
	}
	ps, err := gc.Processes(r.Context())
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	tagOf := map[uint32]string{}
	for tag, pid := range s.tags[sandboxID(r)] {
		tagOf[pid] = tag
	}
	s.mu.Unlock()
	out := []processInfo{}
	for _, pi := range ps {
		if !pi.Running || len(pi.Cmd) == 0 {
			continue
		}
		cwd := pi.Cwd
		info := processInfo{PID: uint32(pi.PID), Config: processConfig{Cmd: pi.Cmd[0], Args: pi.Cmd[1:], Envs: map[string]string{}, Cwd: &cwd}}
		if tag, ok := tagOf[info.PID]; ok {
			info.Tag = &tag
		}
		out = append(out, info)
	}
	return map[string]any{"processes": out}, nil
}

// processOp sends one control op to the selected process.
func (s *Server) processOp(r *http.Request, sel *selector, op func(ctx context.Context, gc *guestapi.Client, pid int) error) (any, error) {
	pid, err := s.pidOf(r, sel)
	if err != nil {
		return nil, err
	}
	gc, err := s.guestOf(r)
	if err != nil {
		return nil, err
	}
	// envd knows running processes only; the guest also keeps finished
	// ones (for reattach), which accept signals as a no-op.
	pi, err := gc.Process(r.Context(), pid)
	if err != nil {
		return nil, err
	}
	if !pi.Running {
		return nil, errdefs.NotFound("process", strconv.Itoa(pid))
	}
	if err := op(r.Context(), gc, pid); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

type inputRequest struct {
	selector
	Input struct {
		Stdin []byte `json:"stdin"`
		PTY   []byte `json:"pty"`
	} `json:"input"`
}

func (s *Server) processInput(r *http.Request, req *inputRequest) (any, error) {
	data := req.Input.Stdin
	if len(req.Input.PTY) > 0 {
		data = req.Input.PTY
	}
	if len(data) == 0 {
		return struct{}{}, nil
	}
	return s.processOp(r, &req.selector, func(ctx context.Context, gc *guestapi.Client, pid int) error {
		return gc.Input(ctx, pid, data)
	})
}

func (s *Server) processCloseStdin(r *http.Request, req *selector) (any, error) {
	return s.processOp(r, req, func(ctx context.Context, gc *guestapi.Client, pid int) error {
		return gc.CloseStdin(ctx, pid)
	})
}

type signalRequest struct {
	selector
	Signal json.RawMessage `json:"signal"`
}

func (s *Server) processSignal(r *http.Request, req *signalRequest) (any, error) {
	// Enums arrive by name ("SIGNAL_SIGKILL") or by number (9).
	var name string
	if err := json.Unmarshal(req.Signal, &name); err != nil {
		var n int
		if json.Unmarshal(req.Signal, &n) != nil || n <= 0 || n > 64 {
			return nil, errdefs.Invalid("signal", "%s is not a signal", req.Signal)
		}
		name = strconv.Itoa(n)
	}
	name = strings.TrimPrefix(name, "SIGNAL_")
	if name == "" || name == "UNSPECIFIED" {
		return nil, errdefs.Invalid("signal", "must name a signal")
	}
	return s.processOp(r, &req.selector, func(ctx context.Context, gc *guestapi.Client, pid int) error {
		return gc.Signal(ctx, pid, name)
	})
}

type updateRequest struct {
	selector
	PTY *ptySize `json:"pty"`
}

func (s *Server) processUpdate(r *http.Request, req *updateRequest) (any, error) {
	if req.PTY == nil {
		return struct{}{}, nil
	}
	tty, err := toTTY(req.PTY)
	if err != nil {
		return nil, err
	}
	return s.processOp(r, &req.selector, func(ctx context.Context, gc *guestapi.Client, pid int) error {
		return gc.Resize(ctx, pid, *tty)
	})
}
