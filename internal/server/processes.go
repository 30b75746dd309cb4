package server

import (
	"io"
	"net/http"
	"strconv"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guest"
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
		{"POST /v1/sandboxes/{id}/processes/{pid}/close-stdin", s.processControl(guest.OpCloseStdin)},
		{"POST /v1/sandboxes/{id}/processes/{pid}/signal", s.processControl(guest.OpSignal)},
		{"POST /v1/sandboxes/{id}/processes/{pid}/resize", s.processControl(guest.OpResize)},
	}
}

func toProcess(pi guest.ProcessInfo) api.Process {
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
	gc, err := s.mgr.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	start := &guest.StartRequest{
		Cmd: req.Cmd, Env: guest.EnvList(req.Env), Cwd: req.Cwd, User: req.User, TTY: req.TTY,
		TimeoutSeconds: req.TimeoutSeconds, Stdin: req.Stdin || req.TTY != nil,
	}
	resp, err := gc.Do(r.Context(), guest.Request{Op: guest.OpStart, Start: start})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if c := s.execStarted(r.Context(), r.PathValue("id"), gc, resp.PID, req.Cmd); c != nil {
		c.Detach() // nobody reads its stream here
	}
	p, err := s.process(r, resp.PID)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusCreated, p)
}

// process looks one process up in the guest's table.
func (s *Server) process(r *http.Request, pid int) (api.Process, error) {
	gc, err := s.mgr.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		return api.Process{}, err
	}
	resp, err := gc.Do(r.Context(), guest.Request{Op: guest.OpList})
	if err != nil {
		return api.Process{}, err
	}
	for _, pi := range resp.Processes {
		if pi.PID == pid {
			return toProcess(pi), nil
		}
	}
	return api.Process{}, errdefs.NotFound("process", strconv.Itoa(pid))
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	gc, err := s.mgr.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	resp, err := gc.Do(r.Context(), guest.Request{Op: guest.OpList})
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	out := make([]api.Process, 0, len(resp.Processes))
	for _, pi := range resp.Processes {
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
	s.streamOp(w, r, r.PathValue("id"), guest.Request{Op: guest.OpAttach, PID: pid, Offset: off}, true, nil)
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
	gc, err := s.mgr.Guest(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	buf := make([]byte, 256<<10)
	for {
		n, rerr := io.ReadFull(r.Body, buf)
		if n > 0 {
			if _, err := gc.Do(r.Context(), guest.Request{Op: guest.OpInput, PID: pid, Data: buf[:n]}); err != nil {
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
		if _, err := gc.Do(r.Context(), guest.Request{Op: guest.OpCloseStdin, PID: pid}); err != nil {
			writeError(w, r, s.log, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// processControl serves close-stdin, signal and resize.
func (s *Server) processControl(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		pid, err := pidParam(r)
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		req := guest.Request{Op: op, PID: pid}
		switch op {
		case guest.OpSignal:
			var body api.SignalRequest
			if err := decode(w, r, &body); err != nil {
				writeError(w, r, s.log, err)
				return
			}
			req.Signal = body.Signal
		case guest.OpResize:
			var body api.TTY
			if err := decode(w, r, &body); err != nil {
				writeError(w, r, s.log, err)
				return
			}
			if err := reqcheck.TTY(&body); err != nil {
				writeError(w, r, s.log, err)
				return
			}
			req.TTY = &body
		}
		gc, err := s.mgr.Guest(r.Context(), r.PathValue("id"))
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		if _, err := gc.Do(r.Context(), req); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}
