package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/telemetry/hub"
	"github.com/paddock-dev/paddock/wire"
)

// lane serves an exec lane (GET /v1/lane with "Upgrade: paddock-lane"): a
// kept connection on which the client sends one exec request frame after
// another, each answered by a started frame, the process's output and
// exit frames, or by an error frame, after which the lane takes the next
// request. It spares each exec an HTTP request and answer: net/http's
// parsing, its read-ahead goroutine on the connection, and the thread
// wakes these cost on both sides, about 0.1 ms of a round trip on a small VM
// (docs/exec.md). An exec that needs input or a terminal goes
// through POST /v1/sandboxes/{id}/exec.
func (s *Server) lane(w http.ResponseWriter, r *http.Request) {
	if !upgradeTo(r, api.LaneProtocol) {
		writeError(w, r, s.log, errdefs.Invalid("upgrade", "GET /v1/lane needs \"Connection: Upgrade\" and \"Upgrade: %s\"", api.LaneProtocol))
		return
	}
	hj, bufrw, ok := s.upgradeLane(w)
	if !ok {
		return
	}
	defer hj.Close()
	s.serveLane(r, bufrw, "")
}

// sandboxLane serves an exec lane bound to sandbox id (GET
// /v1/sandboxes/{id}/lane): its requests must name that sandbox. On a
// local unix socket without TLS the daemon hands the lane to the
// sandbox's guest, which then serves it (internal/guest/lane_linux.go)
// and reports each exec back for the exec log, the events and the busy
// mark; the round trip of a short exec loses two thread wakes and the
// daemon's relay. Anywhere else, or when the guest cannot take it, the
// daemon serves it as it serves /v1/lane.
func (s *Server) sandboxLane(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !upgradeTo(r, api.LaneProtocol) {
		writeError(w, r, s.log, errdefs.Invalid("upgrade", "GET /v1/sandboxes/{id}/lane needs \"Connection: Upgrade\" and \"Upgrade: %s\"", api.LaneProtocol))
		return
	}
	if name := containerOf(r.Context()); name != "" {
		writeError(w, r, s.log, errdefs.Invalid(api.ContainerParam, "a bound lane serves a sandbox's first container; exec in container %s through /exec", name))
		return
	}
	gc, err := s.mgr.RunningGuest(r.Context(), id)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	hj, bufrw, ok := s.upgradeLane(w)
	if !ok {
		return
	}
	defer hj.Close() // our descriptor only; a handed lane lives on in the guest
	if s.handLane(r, id, gc, hj, bufrw) {
		return
	}
	// Served here, it closes when the sandbox ends, as a handed one does:
	// a client's idle lanes to a sandbox that is gone hold nothing here.
	if done, err := s.done(r.Context(), id); err == nil {
		served := make(chan struct{})
		defer close(served)
		go func() {
			select {
			case <-done:
				// The exec in flight still ends with its "sandbox ended"
				// frame; the next read finds the end.
				if cr, ok := hj.(interface{ CloseRead() error }); ok {
					cr.CloseRead()
				} else {
					hj.Close()
				}
			case <-served:
			}
		}()
	}
	s.serveLane(r, bufrw, id)
}

// upgradeLane hijacks the connection and answers the upgrade.
func (s *Server) upgradeLane(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter, bool) {
	hj, bufrw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.log.Warn("hijacking lane connection", "err", err)
		return nil, nil, false
	}
	// No deadline: a lane waits for its next request as long as the
	// client keeps it, as a kept HTTP connection does.
	hj.SetDeadline(time.Time{})
	bufrw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + api.LaneProtocol + "\r\nConnection: Upgrade\r\n\r\n")
	if bufrw.Flush() != nil {
		hj.Close()
		return nil, nil, false
	}
	return hj, bufrw, true
}

// handLane hands a lane to sandbox id's guest when it is a plaintext unix
// socket with nothing read ahead, and follows the guest's reports of its
// execs. It reports whether the guest took the lane.
func (s *Server) handLane(r *http.Request, id string, gc *guestapi.Client, hj net.Conn, bufrw *bufio.ReadWriter) bool {
	sc, ok := hj.(syscall.Conn)
	if !ok || r.TLS != nil || hj.LocalAddr().Network() != "unix" || bufrw.Reader.Buffered() > 0 {
		return false
	}
	rep, err := gc.HandLane(r.Context(), id, sc)
	if err != nil {
		s.log.Debug("exec lane served by the daemon", "sandbox", id, "err", err)
		return false
	}
	go s.laneReports(id, gc, rep)
	return true
}

// maxPassed bounds one count of output a guest reports without its
// bytes: a guest that sends more is confused or hostile.
const maxPassed = 1 << 40

// laneReports follows a guest's reports of the execs on a lane it took
// (guestapi.LaneStart, guestapi.LanePassed): the exec log's copy and events, and the
// sandbox's busy mark while an exec runs. Closing rep (when the reports
// break off or make no sense) closes the lane after its exec in flight.
func (s *Server) laneReports(id string, gc *guestapi.Client, rep *guestapi.Conn) {
	defer rep.Close()
	var cp *hub.ExecCopy
	idle := func() {}
	end := func() {
		if cp != nil {
			cp.Detach()
			cp = nil
		}
		idle()
		idle = func() {}
	}
	defer end()
	for {
		f, err := rep.Frames.Read()
		if err != nil {
			return
		}
		switch f.Type {
		case wire.Started:
			end()
			var st guestapi.LaneStart
			if json.Unmarshal(f.Payload, &st) != nil || st.PID <= 0 {
				return
			}
			idle = s.mgr.Busy(id)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			cp = s.execStarted(ctx, id, gc, st.PID, st.Cmd)
			cancel()
		case wire.Stdout, wire.Stderr, wire.Dropped:
			if cp != nil {
				cp.Frame(f.Type, f.Payload)
			}
		case wire.Release:
			var d guestapi.LanePassed
			if json.Unmarshal(f.Payload, &d) != nil || d.Bytes < 0 || d.Bytes > maxPassed {
				return
			}
			if cp != nil {
				cp.Passed(d.Bytes)
			}
		case wire.Exit, wire.Error:
			// Error: the lane left the exec before its exit; the copy
			// follows it from the guest's ring.
			if cp != nil {
				cp.Frame(f.Type, f.Payload)
			}
			end()
		default:
			return
		}
	}
}

// serveLane answers a lane's requests until the client closes it or
// breaks the framing; bound, if set, is the one sandbox it runs in.
func (s *Server) serveLane(r *http.Request, bufrw *bufio.ReadWriter, bound string) {
	fr := wire.NewReader(bufrw.Reader)
	out := wire.NewWriter(bufrw.Writer)
	for {
		f, err := fr.Read()
		if err != nil {
			return // the client closed the lane, or broke the framing
		}
		if !s.laneExec(r, f, out, bufrw.Writer, bound) {
			return
		}
	}
}

// laneExec answers one frame of a lane. It reports whether the lane can
// take the next request.
func (s *Server) laneExec(r *http.Request, f wire.Frame, out *wire.Writer, bw *bufio.Writer, bound string) bool {
	fail := func(err error) bool {
		return out.WriteJSON(wire.Error, ErrorFrame(r, s.log, err)) == nil && bw.Flush() == nil
	}
	if f.Type != wire.Request {
		fail(errdefs.Invalid("frame", "a lane takes request frames (type %d), not type %d", wire.Request, f.Type))
		return false // out of step: the client is confused or hostile
	}
	req, err := reqcheck.LaneRequest(f.Payload, bound)
	if err != nil {
		return fail(err)
	}
	id := req.Sandbox
	call, whole, before := s.execOp(id, &req.Exec, false)
	st, err := s.callStream(r.Context(), id, call)
	if err != nil {
		return fail(err)
	}
	defer st.idle()
	started, _ := json.Marshal(struct {
		PID int `json:"pid"`
	}{st.pid})
	if whole {
		if body := st.conn.Frames.Whole(wire.Exit); body != nil {
			out.Write(wire.Started, started)
			bw.Write(body)
			ok := bw.Flush() == nil
			st.whole(r.Context(), body, before)
			return ok
		}
	}
	var tee frameTee
	if before != nil {
		if tee = before(r.Context(), st.gc, st.pid, st.conn); tee != nil {
			defer tee.Detach()
		}
	}
	if out.Write(wire.Started, started) != nil {
		st.conn.Close()
		return false
	}
	if st.conn.Frames.Buffered() == 0 && bw.Flush() != nil {
		st.conn.Close()
		return false
	}
	if relay(st.conn, out, bw.Flush, bw.Flush, st.done, tee) {
		st.conn.Release()
	} else {
		st.conn.Close()
	}
	// A stream that ended without its exit frame from the guest still
	// ended with one from relay; the lane is good if that went out.
	return bw.Flush() == nil
}
