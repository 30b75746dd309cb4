package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/wire"
)

// wantsUpgrade reports whether the client asked for a bidirectional stream.
func wantsUpgrade(r *http.Request) bool { return upgradeTo(r, api.StreamProtocol) }

// exec runs a command and streams its frames. Without an upgrade the
// response body is a one-way frame stream and stdin comes from the
// request; with "Upgrade: paddock-stream" the connection carries frames
// both ways after a 101.
func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req api.ExecRequest
	if err := decode(w, r, &req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if err := reqcheck.Exec(&req); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	call, whole, before := s.execOp(id, &req, wantsUpgrade(r))
	s.streamOp(w, r, id, call, whole, before)
}

// streamBefore runs once the guest has answered a stream's request; the
// tee it returns, if any, gets a copy of the frames.
type streamBefore func(ctx context.Context, gc *guestapi.Client, pid int, conn *guestapi.Conn) frameTee

// streamCall is the guest call whose stream is relayed: an attached
// start, or (start nil) an attach to process pid from offset.
type streamCall struct {
	start  *guestapi.StartRequest
	pid    int
	offset int64
}

// open makes the call; it returns the process's pid and its stream.
func (sc streamCall) open(ctx context.Context, gc *guestapi.Client) (int, *guestapi.Conn, error) {
	if sc.start != nil {
		return gc.StartAttached(ctx, sc.start)
	}
	conn, err := gc.Attach(ctx, sc.pid, sc.offset)
	return sc.pid, conn, err
}

// execOp is the guest call of an exec of sandbox id, whether its
// stream may be passed on whole, and what runs once it started: the exec
// log's copy, and the request's stdin sent.
func (s *Server) execOp(id string, req *api.ExecRequest, upgrade bool) (streamCall, bool, streamBefore) {
	start := guestapi.ExecStart(req)
	start.Stdin = start.Stdin || upgrade
	// Input to send after the start needs the guest connection: such a
	// stream is not passed on whole.
	whole := req.Stdin == nil
	return streamCall{start: start}, whole, func(ctx context.Context, gc *guestapi.Client, pid int, conn *guestapi.Conn) (tee frameTee) {
		if c := s.execStarted(ctx, id, gc, pid, req.Cmd); c != nil {
			tee = c
		}
		if req.Stdin == nil || pid == 0 {
			return tee
		}
		in := []byte(*req.Stdin)
		for len(in) > 0 {
			n := min(len(in), 256<<10)
			if conn.Send(wire.Stdin, in[:n]) != nil {
				return
			}
			in = in[n:]
		}
		conn.Send(wire.CloseStdin, nil)
		return tee
	}
}

// frameTee gets a copy of the frames relayed (the exec log) and is told
// when the relay stops.
type frameTee interface {
	Frame(t wire.Type, payload []byte)
	Detach()
}

// streamOp makes a streaming guest call (start with attach, or attach)
// and relays its frames to the client: one way, or both ways after a 101
// when the client asked for an upgrade. before runs once the guest has
// answered, before any output is relayed; the tee it returns, if any, gets
// a copy of the frames. With whole set (before does not use the guest
// connection), a stream that came whole with the guest's answer goes to
// the client first, and before runs after.
func (s *Server) streamOp(w http.ResponseWriter, r *http.Request, id string, call streamCall, whole bool, before streamBefore) {
	st, err := s.callStream(r.Context(), id, call)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	defer st.idle()
	gc, conn, done := st.gc, st.conn, st.done
	pid := strconv.Itoa(st.pid)
	if whole && !wantsUpgrade(r) {
		if body := conn.Frames.Whole(wire.Exit); body != nil {
			s.relayWhole(w, pid, body)
			st.whole(r.Context(), body, before)
			return
		}
	}
	var tee frameTee
	if before != nil {
		if tee = before(r.Context(), gc, st.pid, conn); tee != nil {
			defer tee.Detach()
		}
	}
	if !wantsUpgrade(r) {
		w.Header().Set("Content-Type", api.StreamContentType)
		w.Header().Set("X-Paddock-Pid", pid)
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		// A short command's frames come with the guest's answer: the
		// headers then go with them rather than on their own.
		if conn.Frames.Buffered() == 0 {
			rc.Flush()
		}
		// The last frame is not flushed here: net/http writes it with
		// the body's end when the handler returns, so that the client
		// reads both at once (it reads to the end to reuse the
		// connection).
		// A client that leaves takes its relay with it: the process
		// outlives the stream, and the exec log's copy follows it on a
		// connection of the hub's own (tee.Detach). Otherwise a stream
		// closed while its process runs on kept a goroutine and a 64 KiB
		// buffer here until the process ended (issue 21).
		leave := context.AfterFunc(r.Context(), func() { conn.Close() })
		exited := relay(conn, wire.NewWriter(w), func() error { return rc.Flush() }, func() error { return nil }, done, tee)
		if leave() && exited {
			// Nothing else writes to the guest: the connection can
			// carry the sandbox's next call.
			conn.Release()
		} else {
			conn.Close()
		}
		return
	}
	defer conn.Close()
	hj, bufrw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.log.Warn("hijacking stream connection", "err", err)
		return
	}
	defer hj.Close()
	bufrw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + api.StreamProtocol +
		"\r\nConnection: Upgrade\r\nX-Paddock-Pid: " + pid + "\r\n\r\n")
	if conn.Frames.Buffered() == 0 {
		if err := bufrw.Flush(); err != nil {
			return
		}
	}
	go forwardInput(bufrw.Reader, conn)
	relay(conn, wire.NewWriter(bufrw.Writer), bufrw.Flush, bufrw.Flush, done, tee)
}

// guestStream is a stream call the guest has answered.
type guestStream struct {
	gc   *guestapi.Client
	pid  int
	conn *guestapi.Conn
	done <-chan struct{} // closed when the sandbox ends
	idle func()          // the sandbox is no longer busy with it
}

// callStream makes a stream call to sandbox id's guest. The caller must
// call idle when the stream is over.
func (s *Server) callStream(ctx context.Context, id string, call streamCall) (*guestStream, error) {
	gc, err := s.guest(ctx, id)
	if err != nil {
		return nil, err
	}
	idle := s.mgr.Busy(id)
	done, err := s.done(ctx, id)
	if err != nil {
		idle()
		return nil, err
	}
	pid, conn, err := call.open(ctx, gc)
	if err != nil {
		idle()
		return nil, err
	}
	return &guestStream{gc: gc, pid: pid, conn: conn, done: done, idle: idle}, nil
}

// whole finishes a stream that came whole and was passed on: the guest
// connection goes back for the next call, and before runs (the exec log
// gets the frames), after the client has its answer.
func (st *guestStream) whole(ctx context.Context, body []byte, before streamBefore) {
	st.conn.Release()
	// The client may be gone already: what is left is ours.
	if before != nil {
		if tee := before(context.WithoutCancel(ctx), st.gc, st.pid, st.conn); tee != nil {
			teeWhole(tee, body)
			tee.Detach()
		}
	}
}

// relayWhole answers with a stream that is whole, exit frame included:
// one write with its length, and nothing else (the exec log's copy, the
// guest connection's release) is done before it.
func (s *Server) relayWhole(w http.ResponseWriter, pid string, body []byte) {
	h := w.Header()
	h.Set("Content-Type", api.StreamContentType)
	h.Set("X-Paddock-Pid", pid)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
	http.NewResponseController(w).Flush()
}

// teeWhole gives tee the frames of a whole stream.
func teeWhole(tee frameTee, body []byte) {
	fr := wire.NewReader(bytes.NewReader(body))
	for {
		f, err := fr.Read()
		if err != nil {
			return
		}
		tee.Frame(f.Type, f.Payload)
	}
}

// forwardInput passes the client's input frames to the guest until the
// client stops sending.
func forwardInput(client *bufio.Reader, conn *guestapi.Conn) {
	fr := wire.NewReader(client)
	for {
		f, err := fr.Read()
		if err != nil {
			return
		}
		switch f.Type {
		case wire.Stdin, wire.CloseStdin, wire.Signal, wire.Resize:
			if conn.Send(f.Type, f.Payload) != nil {
				return
			}
		}
	}
}

// relay copies the guest's frames to the client until the exit frame. If
// the guest connection breaks first, the stream still ends with an exit
// frame saying why. flush sends what is written when nothing more is
// pending; last sends the final frame. tee, if set, gets each frame after
// the client. It reports whether the guest's stream ended with its exit
// frame, read whole.
func relay(conn *guestapi.Conn, out *wire.Writer, flush, last func() error, done <-chan struct{}, tee frameTee) (exited bool) {
	for {
		f, err := conn.Frames.Read()
		if err != nil {
			st := api.ExitStatus{ExitCode: -1, Error: "lost the connection to the sandbox"}
			select {
			case <-done:
				st.Error = "sandbox ended"
			default:
				if sandboxEnding(done) {
					st.Error = "sandbox ended"
				}
			}
			b, _ := json.Marshal(st)
			out.Write(wire.Exit, b)
			last()
			return false
		}
		if err := out.Write(f.Type, f.Payload); err != nil {
			return false
		}
		if f.Type == wire.Exit || f.Type == wire.Error {
			last()
			if tee != nil {
				tee.Frame(f.Type, f.Payload)
			}
			return f.Type == wire.Exit
		}
		if tee != nil {
			tee.Frame(f.Type, f.Payload)
		}
		if conn.Frames.Buffered() == 0 {
			if err := flush(); err != nil {
				return false
			}
		}
	}
}

// sandboxEnding waits briefly for done: a guest connection that breaks
// because the sandbox was killed races with the pidfd telling us so.
func sandboxEnding(done <-chan struct{}) bool {
	t := time.NewTimer(500 * time.Millisecond)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}
