package server

import (
	"bufio"
	"encoding/json"
	"net/http"
	"time"

	"paddock/api"
	"paddock/internal/errdefs"
	"paddock/internal/reqcheck"
	"paddock/wire"
)

// lane serves an exec lane (GET /v1/lane with "Upgrade: paddock-lane"): a
// kept connection on which the client sends one exec request frame after
// another, each answered by a started frame, the process's output and
// exit frames, or by an error frame, after which the lane takes the next
// request. It spares each exec an HTTP request and answer: net/http's
// parsing, its read-ahead goroutine on the connection, and the thread
// wakes these cost on both sides, about 0.1 ms of a round trip on a small VM
// (docs/ARCHITECTURE.md). An exec that needs input or a terminal goes
// through POST /v1/sandboxes/{id}/exec.
func (s *Server) lane(w http.ResponseWriter, r *http.Request) {
	if !upgradeTo(r, api.LaneProtocol) {
		writeError(w, r, s.log, errdefs.Invalid("upgrade", "GET /v1/lane needs \"Connection: Upgrade\" and \"Upgrade: %s\"", api.LaneProtocol))
		return
	}
	hj, bufrw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.log.Warn("hijacking lane connection", "err", err)
		return
	}
	defer hj.Close()
	// No deadline: a lane waits for its next request as long as the
	// client keeps it, as a kept HTTP connection does.
	hj.SetDeadline(time.Time{})
	bufrw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + api.LaneProtocol + "\r\nConnection: Upgrade\r\n\r\n")
	if bufrw.Flush() != nil {
		return
	}
	fr := wire.NewReader(bufrw.Reader)
	out := wire.NewWriter(bufrw.Writer)
	for {
		f, err := fr.Read()
		if err != nil {
			return // the client closed the lane, or broke the framing
		}
		if !s.laneExec(r, f, out, bufrw.Writer) {
			return
		}
	}
}

// laneExec answers one frame of a lane. It reports whether the lane can
// take the next request.
func (s *Server) laneExec(r *http.Request, f wire.Frame, out *wire.Writer, bw *bufio.Writer) bool {
	fail := func(err error) bool {
		code, body := errorBody(r, s.log, err)
		body.Status = code
		return out.WriteJSON(wire.Error, body) == nil && bw.Flush() == nil
	}
	if f.Type != wire.Request {
		fail(errdefs.Invalid("frame", "a lane takes request frames (type %d), not type %d", wire.Request, f.Type))
		return false // out of step: the client is confused or hostile
	}
	req, err := reqcheck.LaneRequest(f.Payload)
	if err != nil {
		return fail(err)
	}
	id := req.Sandbox
	greq, whole, before := s.execOp(id, &req.Exec, false)
	st, err := s.callStream(r.Context(), id, greq)
	if err != nil {
		return fail(err)
	}
	defer st.idle()
	started, _ := json.Marshal(struct {
		PID int `json:"pid"`
	}{st.resp.PID})
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
		if tee = before(r.Context(), st.gc, st.resp, st.conn); tee != nil {
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
