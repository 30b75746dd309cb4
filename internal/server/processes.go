package server

import (
	"io"
	"net/http"
	"strconv"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
)

// processRoutes are the /v1/sandboxes/{id}/processes endpoints: start in
// the background, list, inspect, attach (replaying output from an offset),
// and send input, signals and terminal sizes.
func (s *Server) processRoutes() []route {
	return []route{
		{"POST /v1/sandboxes/{id}/processes", s.startProcess},
		{"GET /v1/sandboxes/{id}/processes", s.listProcesses},
		{"GET /v1/sandboxes/{id}/processes/{pid}", s.getProcess},
		{"GET /v1/sandboxes/{id}/processes/{pid}/stream", s.attachProcess},
		{"POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.processInput},
		{"POST /v1/sandboxes/{id}/processes/{pid}/close-stdin", s.processControl(closeStdin)},
		{"POST /v1/sandboxes/{id}/processes/{pid}/signal", s.processControl(signal)},
		{"POST /v1/sandboxes/{id}/processes/{pid}/resize", s.processControl(resize)},
	}
}

func toProcess(pi guestapi.ProcessInfo) api.Process {
	p := api.Process{
		PID: pi.PID, Cmd: pi.Cmd, User: pi.User, Cwd: pi.Cwd, TTY: pi.TTY, StartedAt: pi.StartedAt,
		State: "running", Exit: pi.Exit, OutputBytes: pi.OutputBytes, DroppedBytes: pi.DroppedBytes,
	}
	if !pi.Running {
		p.State = "exited"
	}
	return p
}

func pidParam(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return 0, errdefs.Invalid("pid", "%q is not a process id", r.PathValue("pid"))
	}
	return pid, nil
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req api.StartRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	exec := api.ExecRequest{Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, User: req.User, TTY: req.TTY, TimeoutSeconds: req.TimeoutSeconds}
	if err := reqcheck.Exec(&exec); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, err := s.guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	start := &guestapi.StartRequest{
		Cmd: req.Cmd, Env: guestapi.EnvList(req.Env), Cwd: req.Cwd, User: req.User, TTY: req.TTY,
		TimeoutSeconds: req.TimeoutSeconds, Stdin: req.Stdin || req.TTY != nil,
	}
	pid, err := gc.Start(r.Context(), start)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if c := s.execStarted(r.Context(), r.PathValue("id"), gc, pid, req.Cmd); c != nil {
		c.Detach() // nobody reads its stream here
	}
	p, err := s.process(r, pid)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, p)
}

// process looks one process up in the guest's table.
func (s *Server) process(r *http.Request, pid int) (api.Process, error) {
	gc, err := s.guest(r.Context(), r.PathValue("id"))
	if err != nil {
		return api.Process{}, err
	}
	pi, err := gc.Process(r.Context(), pid)
	if err != nil {
		return api.Process{}, err
	}
	return toProcess(pi), nil
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	gc, err := s.guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	ps, err := gc.Processes(r.Context())
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	out := make([]api.Process, 0, len(ps))
	for _, pi := range ps {
		out = append(out, toProcess(pi))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err == nil {
		var p api.Process
		if p, err = s.process(r, pid); err == nil {
			writeJSON(w, http.StatusOK, p)
			return
		}
	}
	writeError(w, r, s.log, err)
}

// attachProcess streams a process's output from ?offset= (default 0: all
// that is retained), ending with its exit frame; with an upgrade the
// client can send input, signals and sizes too.
func (s *Server) attachProcess(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	var off int64
	if v := r.URL.Query().Get("offset"); v != "" {
		if off, err = strconv.ParseInt(v, 10, 64); err != nil || off < 0 {
			writeError(w, r, s.log, errdefs.Invalid("offset", "%q is not a byte offset", v))
			return
		}
	}
	s.streamOp(w, r, r.PathValue("id"), streamCall{pid: pid, offset: off}, true, nil)
}

// processInput writes the request body to the process's stdin, streaming;
// with ?close=true stdin is closed afterwards.
func (s *Server) processInput(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	closeAfter, err := boolParam(r, "close")
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	gc, err := s.guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := io.ReadFull(r.Body, buf)
		if n > 0 {
			if err := gc.Input(r.Context(), pid, buf[:n]); err != nil {
				writeError(w, r, s.log, err)
				return
			}
		}
		if rerr != nil {
			if rerr != io.EOF && rerr != io.ErrUnexpectedEOF {
				writeError(w, r, s.log, errdefs.Invalid("body", "reading input: %v", rerr))
				return
			}
			break
		}
	}
	if closeAfter {
		if err := gc.CloseStdin(r.Context(), pid); err != nil {
			writeError(w, r, s.log, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// control is one of the ops processControl serves: it reads the
// request's body, if any, and returns the call that sends the op to a
// process.
type control func(w http.ResponseWriter, r *http.Request) (func(gc *guestapi.Client, pid int) error, error)

func closeStdin(_ http.ResponseWriter, r *http.Request) (func(*guestapi.Client, int) error, error) {
	return func(gc *guestapi.Client, pid int) error { return gc.CloseStdin(r.Context(), pid) }, nil
}

func signal(w http.ResponseWriter, r *http.Request) (func(*guestapi.Client, int) error, error) {
	var body api.SignalRequest
	if err := decode(w, r, &body); err != nil {
		return nil, err
	}
	return func(gc *guestapi.Client, pid int) error { return gc.Signal(r.Context(), pid, body.Signal) }, nil
}

func resize(w http.ResponseWriter, r *http.Request) (func(*guestapi.Client, int) error, error) {
	var body api.TTY
	if err := decode(w, r, &body); err != nil {
		return nil, err
	}
	if err := reqcheck.TTY(&body); err != nil {
		return nil, err
	}
	return func(gc *guestapi.Client, pid int) error { return gc.Resize(r.Context(), pid, body) }, nil
}

// processControl serves close-stdin, signal and resize.
func (s *Server) processControl(op control) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		pid, err := pidParam(r)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		send, err := op(w, r)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		gc, err := s.guest(r.Context(), r.PathValue("id"))
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		if err := send(gc, pid); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}
