package guest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/wire"
)

// Exec lanes bound to one sandbox are served here, in its guest: the
// daemon checks the caller and the sandbox's state, answers the upgrade,
// and hands the client's socket over (OpLane). The client's execs then
// reach the guest without the daemon in between, and their frames go
// straight back: two thread wakes and the daemon's relay fewer per exec
// (docs/exec.md, "Lanes bound to a sandbox"). The daemon still sees every exec:
// the guest reports each one on the connection that handed the lane over
// (its start, its output up to a budget and then its byte counts, its
// exit), and the daemon keeps the exec log, the events and the sandbox's
// busy mark from those reports. A lane closes when that connection does
// (the daemon is gone: no execs it could not log), after the exec in
// flight.
//
// Only a unix socket is handed over: a TCP socket could be disconnected
// (connect with AF_UNSPEC) and connected anywhere from the host's network
// namespace by whoever held it.
//
// The fast guest (internal/guestc) serves lanes the same way, their plain
// execs in C; at its handover it leaves them here where each stands
// (guestapi.HandoverLane), and adoptLane serves them on.

func init() { extraOps[guestapi.OpLane] = (*server).opLane }

// maxLanes bounds the lanes one guest serves; past it the daemon serves
// the lane itself.
const maxLanes = 64

// reportBudget is how much of one exec's output a lane's reports carry;
// past it they carry byte counts, and the daemon's copy fetches what the
// exec log keeps from the output ring.
const reportBudget = 256 << 10

// maxReportBacklog bounds the reports waiting for the daemon to read
// them (memory the sandbox pays for); past it the reports stop and the
// lane ends after its exec.
const maxReportBacklog = 1 << 20

// Report frames, guest to daemon, one exec after another: wire.Started
// (guestapi.LaneStart), the exec's output frames while its budget lasts,
// then wire.Release frames (guestapi.LanePassed: output passed on that
// the reports do not carry), and its wire.Exit.

// opLane takes a lane's socket from the daemon and serves it until the
// client or the daemon closes it.
func (s *server) opLane(c *opConn, req guestapi.Request) {
	if err := reqcheck.SandboxID("sandbox", req.Sandbox); err != nil {
		c.respond(guestapi.Response{}, err)
		return
	}
	uc, ok := c.conn.(*net.UnixConn)
	if !ok {
		c.respond(guestapi.Response{}, errdefs.Invalid("op", "a lane is handed over on a unix socket"))
		return
	}
	if s.lanes.Add(1) > maxLanes {
		s.lanes.Add(-1)
		c.respond(guestapi.Response{}, errdefs.New(errdefs.ErrUnavailable, "this sandbox serves %d lanes already", maxLanes))
		return
	}
	defer s.lanes.Add(-1)
	if c.respond(guestapi.Response{}, nil) != nil || c.fr.Buffered() > 0 {
		return
	}
	lane, err := receiveConn(uc)
	if err != nil {
		s.log.Warn("taking an exec lane", "err", err)
		return
	}
	// A lane is the host's socket too: a quiesce closes it.
	if s.ctl != nil {
		if !s.ctl.add(lane) {
			lane.Close()
			return
		}
		defer s.ctl.remove(lane)
	}
	s.serveLane(lane, c.conn, req.Sandbox, nil)
}

// adoptLane takes over an exec lane the fast guest served, where it left
// it (hc.Lane).
func (s *server) adoptLane(hc guestapi.HandoverConn) error {
	rep, err := adoptedConn(hc.Lane.Report, "lane reports")
	if err != nil {
		unix.Close(hc.FD)
		return err
	}
	lane, err := adoptedConn(hc.FD, "lane")
	if err != nil {
		rep.Close()
		return err
	}
	s.lanes.Add(1)
	if !s.ctl.add(rep) {
		s.lanes.Add(-1)
		rep.Close()
		lane.Close()
		return nil
	}
	if !s.ctl.add(lane) {
		s.lanes.Add(-1)
		s.ctl.remove(rep)
		rep.Close()
		lane.Close()
		return nil
	}
	go func() {
		defer s.lanes.Add(-1)
		defer s.ctl.remove(rep)
		defer rep.Close()
		defer s.ctl.remove(lane)
		s.serveLane(lane, rep, hc.Lane.Sandbox, &hc)
	}()
	return nil
}

// receiveConn reads one byte carrying a unix stream socket (SCM_RIGHTS).
func receiveConn(uc *net.UnixConn) (net.Conn, error) {
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	_, oobn, _, _, err := uc.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("expected one descriptor, got %d", len(fds))
	}
	unix.CloseOnExec(fds[0])
	f := os.NewFile(uintptr(fds[0]), "lane")
	defer f.Close()
	if t, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil || t != unix.AF_UNIX {
		return nil, errors.New("the descriptor is not a unix socket")
	}
	if t, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_TYPE); err != nil || t != unix.SOCK_STREAM {
		return nil, errors.New("the descriptor is not a stream socket")
	}
	return net.FileConn(f)
}

// laneState is one lane's: whether an exec is in flight, and whether the
// daemon is gone. The daemon's going closes an idle lane at once, a busy
// one after its exec.
type laneState struct {
	mu   sync.Mutex
	busy bool
	gone bool
	conn net.Conn
}

// begin marks an exec in flight; false if the daemon is gone.
func (l *laneState) begin() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busy = !l.gone
	return l.busy
}

// end marks the exec over; false if the daemon went meanwhile.
func (l *laneState) end() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busy = false
	return !l.gone
}

// daemonGone closes the lane now if it is idle.
func (l *laneState) daemonGone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gone = true
	if !l.busy {
		l.conn.Close()
	}
}

// serveLane answers the lane's requests, bound to sandbox id, reporting
// each exec on rep; at, if set, is where the fast guest left the lane.
func (s *server) serveLane(lane, rep net.Conn, id string, at *guestapi.HandoverConn) {
	wire.SetSendBuffer(lane)
	st := &laneState{conn: lane}
	// Reports that cannot be sent end the lane as the daemon's going
	// does: after the exec in flight.
	r := newReporter(rep, st.daemonGone)
	defer r.close()
	defer lane.Close() // first: the client need not wait for the reports
	in := io.Reader(lane)
	// resumed: an exec or a request the fast guest left in flight.
	resumed, gone := false, false
	if at != nil {
		resumed, gone = at.PID != 0 || at.Request != nil, r.resume(at.Lane)
		st.busy, st.gone = resumed, gone
		if len(at.Lane.Read) > 0 {
			in = io.MultiReader(bytes.NewReader(at.Lane.Read), lane)
		}
	}
	go func() {
		// The daemon sends nothing more: a read ends when it closes.
		var b [1]byte
		rep.Read(b[:])
		st.daemonGone()
	}()
	fr := wire.NewReader(in)
	fw := wire.NewWriter(lane)
	fail := func(err error) bool {
		body := api.Error{Status: errdefs.HTTPStatus(err), Code: errdefs.Code(err), Message: err.Error()}
		return fw.WriteJSON(wire.Error, body) == nil
	}
	if resumed {
		ok := false
		if at.Request != nil {
			ok = s.laneRequest(lane, at.Request, id, r, fail)
		} else if p, err := s.lookup(at.PID); err == nil {
			ok = s.laneStream(lane, p, r, at.Offset, at.Answer)
		}
		if !st.end() || !ok {
			return
		}
	} else if gone {
		return
	}
	for {
		f, err := fr.Read()
		if err != nil || !st.begin() {
			return
		}
		if f.Type != wire.Request {
			fail(errdefs.Invalid("frame", "a lane takes request frames (type %d), not type %d", wire.Request, f.Type))
			return // out of step: the client is confused or hostile
		}
		ok := s.laneRequest(lane, f.Payload, id, r, fail)
		if !st.end() || !ok {
			return
		}
	}
}

// laneRequest serves one request of a lane bound to sandbox id. It
// reports whether the lane is at a request's boundary.
func (s *server) laneRequest(lane net.Conn, payload []byte, id string, r *reporter, fail func(error) bool) bool {
	req, err := reqcheck.LaneRequest(payload, id)
	if err != nil {
		return fail(err)
	}
	return s.laneExec(lane, &req.Exec, r, fail)
}

// laneExec runs one exec of a lane and streams it to the client. It
// reports whether the lane is at a request's boundary.
func (s *server) laneExec(lane net.Conn, req *api.ExecRequest, r *reporter, fail func(error) bool) bool {
	p, err := s.spawn(guestapi.ExecStart(req))
	if errors.Is(err, errdefs.ErrInvalid) {
		return fail(err)
	}
	fw := streamWriter{conn: lane}
	if err != nil {
		// As on the daemon's way: the stream ends at once.
		fw.pending = wire.AppendFrame(nil, wire.Started, []byte(`{"pid":0}`))
		b, _ := json.Marshal(cannotRun(err))
		return fw.write(wire.Exit, b) == nil
	}
	if req.Stdin != nil {
		in := []byte(*req.Stdin)
		go func() {
			s.control(p, guestapi.Request{Op: guestapi.OpInput, Data: in})
			s.control(p, guestapi.Request{Op: guestapi.OpCloseStdin})
		}()
	}
	started, _ := json.Marshal(struct {
		PID int `json:"pid"`
	}{p.pid})
	r.start(p.pid, req.Cmd)
	return s.laneStream(lane, p, r, 0, wire.AppendFrame(nil, wire.Started, started))
}

// laneStream streams p to the lane from output offset off, answer (the
// exec's wire.Started frame, if it has not gone) first. It reports
// whether the lane is at a request's boundary.
func (s *server) laneStream(lane net.Conn, p *process, r *reporter, off int64, answer []byte) bool {
	fw := streamWriter{conn: lane, pending: answer}
	cur := p.out.attach(off)
	defer p.out.detach(cur)
	held, stop := holdAnswer(p)
	defer stop()
	exited := s.pour(&fw, p, cur, nil, held, r.frame)
	if exited {
		s.refillOutPipes()
	} else {
		// The client is gone; the daemon's copy follows the ring to the
		// exit, and the process runs on.
		r.detach()
	}
	return exited
}

// reporter sends a lane's reports to the daemon from a goroutine of its
// own, so that a slow daemon never holds the lane up. Frames wait in
// pending, up to maxReportBacklog; past it, or when a write fails, the
// reports stop and broken is called (the lane ends after its exec).
type reporter struct {
	conn   net.Conn
	broken func()
	poke   chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	pending []byte
	budget  int   // of the exec in flight
	passed  int64 // output passed on that the reports did not carry yet
	failed  bool
	closed  bool
	// begun: the exec in flight's start went (with its first frame);
	// later output waits for timer, up to reportDelay.
	begun bool
	timer *time.Timer
}

// reportDelay is how long an exec's output reports may wait to go to the
// daemon once its start has gone: the exec log writes a batch a second
// anyway, and a report per frame would cost a chatty process's stream a
// goroutine hand-off and a write each (measured with 200 concurrent
// streams: their frame latency rose by a few ms at the median).
const reportDelay = 50 * time.Millisecond

// reportSoon is how much waiting output is sent without waiting.
const reportSoon = 64 << 10

func newReporter(conn net.Conn, broken func()) *reporter {
	r := &reporter{conn: conn, broken: broken, poke: make(chan struct{}, 1), done: make(chan struct{})}
	go r.run()
	return r
}

// resume takes the reports on where the fast guest left them, and
// reports whether they had broken off.
func (r *reporter) resume(h *guestapi.HandoverLane) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.budget, r.passed, r.begun = h.Budget, h.Passed, h.Begun
	if h.Failed {
		r.failed = true
		return true
	}
	r.pending = append(r.pending, h.Reports...)
	if len(r.pending) > 0 {
		r.kickLocked()
	}
	return false
}

func (r *reporter) run() {
	defer close(r.done)
	for range r.poke {
		r.mu.Lock()
		b := r.pending
		r.pending = nil
		r.mu.Unlock()
		if len(b) == 0 {
			continue
		}
		if _, err := r.conn.Write(b); err != nil {
			r.mu.Lock()
			r.failed = true
			r.mu.Unlock()
			r.broken()
		}
	}
}

// add queues a frame; the caller holds mu.
func (r *reporter) addLocked(t wire.Type, payload []byte) {
	if r.failed {
		return
	}
	if len(r.pending)+len(payload) > maxReportBacklog {
		r.failed = true
		go r.broken()
		return
	}
	r.pending = wire.AppendFrame(r.pending, t, payload)
}

// flushPassedLocked queues the count of output not carried.
func (r *reporter) flushPassedLocked() {
	if r.passed > 0 {
		b, _ := json.Marshal(guestapi.LanePassed{Bytes: r.passed})
		r.addLocked(wire.Release, b)
		r.passed = 0
	}
}

// start queues an exec's start; it goes with the exec's first frame to
// the client (its answer, held until output, exit or startHold).
func (r *reporter) start(pid int, cmd []string) {
	b, _ := json.Marshal(guestapi.LaneStart{PID: pid, Cmd: cmd})
	r.mu.Lock()
	r.budget = reportBudget
	r.begun = false
	r.addLocked(wire.Started, b)
	r.mu.Unlock()
}

// kickLocked has the queue sent now.
func (r *reporter) kickLocked() {
	if r.closed {
		return
	}
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// kickLater has the queue sent within reportDelay.
func (r *reporter) kickLater() {
	if r.timer == nil && !r.closed {
		r.timer = time.AfterFunc(reportDelay, func() {
			r.mu.Lock()
			r.timer = nil
			r.kickLocked()
			r.mu.Unlock()
		})
	}
}

// frame reports a frame the client was sent (t 0: the answer alone).
func (r *reporter) frame(t wire.Type, payload []byte) {
	r.mu.Lock()
	switch t {
	case wire.Stdout, wire.Stderr:
		if len(payload) <= r.budget {
			r.budget -= len(payload)
			r.flushPassedLocked()
			r.addLocked(t, payload)
		} else {
			r.budget = 0
			r.passed += int64(len(payload))
		}
	case wire.Dropped, wire.Exit:
		r.flushPassedLocked()
		r.addLocked(t, payload)
	}
	// The start (the busy mark) and the exit go at once, output soon.
	if !r.begun || t == wire.Exit || len(r.pending) >= reportSoon {
		r.kickLocked()
	} else {
		r.kickLater()
	}
	r.begun = true
	r.mu.Unlock()
}

// detach reports that the lane stopped following an exec before its
// exit: the daemon's copy carries on from the ring.
func (r *reporter) detach() {
	r.mu.Lock()
	r.flushPassedLocked()
	r.addLocked(wire.Error, nil)
	r.kickLocked()
	r.mu.Unlock()
}

// close sends what is queued and stops the reporter.
func (r *reporter) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.kickLocked()
	r.closed = true
	r.mu.Unlock()
	close(r.poke)
	// A daemon that stopped reading (but holds the connection) does not
	// hold the lane's goroutine for longer than this.
	r.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	<-r.done
}
