package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/fdnotify"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/telemetry/events"
	"github.com/paddock-dev/paddock/internal/telemetry/execlog"
	"github.com/paddock-dev/paddock/wire"
)

// copyBudget is how much of a process's output the copy takes in hand
// per batch. A process that says less than that a second is copied from
// the stream as it goes; beyond it the copy only counts the bytes and
// fetches what the log keeps of them from the guest's output ring when it
// writes the batch. So a fast stream costs the relay nothing per frame
// past the budget, and the copy at most the log's cap a second.
const copyBudget = 1 << 20

// fetchTimeout bounds one fetch of output from the guest's ring.
const fetchTimeout = 30 * time.Second

// errStopping ends a copy because the daemon is stopping; the next daemon
// resumes it from the log's offset.
var errStopping = errors.New("the daemon is stopping")

// ExecCopy is the exec log's copy of one process's output. Whoever reads
// the process's frames anyway (the exec stream the server relays) hands
// them to Frame; when that reader stops before the exit, Detach, and the
// copy carries on from a connection of the hub's own.
type ExecCopy struct {
	h       *Hub
	id      string
	ctr     string // the container, "" for the first
	gc      *guestapi.Client
	pid     int
	cmd     []string // cut for events
	started time.Time
	w       *execlog.Writer // the copy's goroutine's
	out     *batch          // the copy's goroutine's
	saved   bool            // the copy's goroutine's: w's record is on disk

	// relay feeds the copy from the server's stream, without waiting.
	relay feeder
	// budget is how many bytes a feeder may still copy before the next
	// write; seen is the offset after the last byte a feeder passed, and
	// poke (capacity 1) tells the copy's goroutine that a feeder passed
	// bytes without copying them.
	budget atomic.Int64
	seen   atomic.Int64
	poke   chan struct{}
}

// relayed is a frame handed to the copy's goroutine: off is the offset
// of its first byte (after the bytes it reports, for Dropped; of the end
// of the output, for Exit and Error).
type relayed struct {
	t   wire.Type
	off int64
	p   []byte
}

// feeder is one source of the copy's frames: the server's relay, or the
// hub's own connection (follow). The relay's never waits: when the copy's
// queue is full it gives up, and the copy follows on its own. It takes
// output in hand while the budget lasts and counts the rest.
type feeder struct {
	c      *ExecCopy
	ch     chan relayed
	to     func(relayed) // instead of ch: handed over on the copy's own goroutine (follow)
	next   int64         // offset of the next output byte
	closed bool
}

// frame hands one frame of the stream over; it reports false once the
// feeding has ended.
func (f *feeder) frame(t wire.Type, p []byte) bool {
	if f.closed {
		return false
	}
	c := f.c
	switch t {
	case wire.Stdout, wire.Stderr:
		off, n := f.next, int64(len(p))
		f.next += n
		if c.budget.Load() < n {
			c.counted(f.next)
			return true
		}
		c.budget.Add(-n)
		return f.send(relayed{t: t, off: off, p: bytes.Clone(p)})
	case wire.Dropped:
		var d struct {
			Bytes int64 `json:"bytes"`
		}
		if json.Unmarshal(p, &d) == nil && d.Bytes > 0 {
			f.next += d.Bytes
		}
		return f.send(relayed{t: t, off: f.next})
	case wire.Exit, wire.Error:
		if f.send(relayed{t: t, off: f.next, p: bytes.Clone(p)}) {
			f.close()
		}
		return false
	}
	return true
}

func (f *feeder) send(r relayed) bool {
	if f.to != nil {
		f.to(r)
		return true
	}
	select {
	case f.ch <- r:
		return true
	default:
	}
	// The copy's goroutine fetches what this feeder passed from the
	// guest's ring (or, if it stops, follows from its offset).
	f.close()
	return false
}

// close ends the feeding; what it passed is counted in seen.
func (f *feeder) close() {
	if !f.closed {
		f.closed = true
		f.c.seen.Store(f.next)
		if f.ch != nil {
			close(f.ch)
		}
	}
}

// ExecStarted records that process pid of container ctr ("" for the
// first) of sandbox id started running cmd and returns the copy of its output: feed it with Frame, and call Detach
// when no longer feeding it. The process's log entry exists when it
// returns (a client may ask for it at once); its start event and the copy
// follow on a goroutine of its own.
func (h *Hub) ExecStarted(id, ctr string, gc *guestapi.Client, pid int, cmd []string) *ExecCopy {
	c := h.newCopy(id, ctr, gc, pid, events.CutCmd(cmd), time.Now())
	c.relay = feeder{c: c, ch: make(chan relayed, 64)}
	w, err := h.execs.Start(c.id, c.ctr, c.pid, cmd, c.started)
	h.wg.Add(1)
	go func() {
		// The start event is written here, before the exit's, rather
		// than on the exec's way to its client.
		h.append(c.id, events.Event{Type: events.Exec, Message: "started " + strings.Join(c.cmd, " "),
			Data: events.Data(events.ExecData{Container: c.ctr, PID: c.pid, Cmd: c.cmd})})
		if err != nil {
			if !errors.Is(err, execlog.ErrRemoved) {
				h.log.Warn("keeping exec output", "sandbox", c.id, "pid", c.pid, "err", err)
			}
			h.wg.Done()
			return
		}
		c.run(w, true, h.wg.Done)
	}()
	return c
}

func (h *Hub) newCopy(id, ctr string, gc *guestapi.Client, pid int, cmd []string, started time.Time) *ExecCopy {
	c := &ExecCopy{h: h, id: id, ctr: ctr, gc: gc, pid: pid, cmd: cmd, started: started, poke: make(chan struct{}, 1)}
	c.budget.Store(copyBudget)
	return c
}

// Frame passes one frame of the process's stream (the payload is only
// read during the call). It never waits for the copy: the stream is a hot
// path. Past the budget it only counts output; when the copy falls behind
// (its queue is full), the feeding stops and the copy carries on from the
// guest's output ring at its offset, as when a client leaves early.
func (c *ExecCopy) Frame(t wire.Type, payload []byte) { c.relay.frame(t, payload) }

// Passed counts n bytes of output that went by without their frames (an
// exec lane's reports past their budget): the copy fetches what the log
// keeps of them from the guest's output ring.
func (c *ExecCopy) Passed(n int64) {
	f := &c.relay
	if f.closed || n <= 0 {
		return
	}
	f.next += n
	c.counted(f.next)
}

// counted tells the copy's goroutine that output up to offset next went
// by uncopied: it fetches that from the guest's ring.
func (c *ExecCopy) counted(next int64) {
	c.seen.Store(next)
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// Detach ends the feeding: if the exit has not come, a connection of the
// hub's own attaches where the copy is and carries on to the exit.
func (c *ExecCopy) Detach() { c.relay.close() }

// run keeps the output in the log entry w until the exit: from the relay
// first if relayed, then from a connection of its own. It calls done
// when the copy has ended, on whichever goroutine ends it: a copy that
// follows a quiet process holds none meanwhile (follow).
func (c *ExecCopy) run(w *execlog.Writer, relayed bool, done func()) {
	c.w, c.out = w, newBatch(w.Offset(), c.h.execs.ProcessCap())
	c.saved = !relayed // a resumed copy's record is on disk
	end := func(exit *api.ExitStatus, err error) {
		c.end(exit, err)
		done()
	}
	var exit *api.ExitStatus
	var err error
	if relayed {
		exit, err = c.consume(c.relay.ch)
	}
	if exit == nil && err == nil {
		if relayed {
			// The relay's queue is closed (consume saw it end), or is
			// closed right after the error frame consume stopped at: a
			// follow that lasts the process's life need not keep it.
			for range c.relay.ch {
			}
			c.relay.ch = nil
		}
		c.follow(end)
		return
	}
	end(exit, err)
}

// end records how the copy ended: the exit, or nothing (the next daemon
// carries on from the log's offset, or the log failed).
func (c *ExecCopy) end(exit *api.ExitStatus, err error) {
	switch {
	case errors.Is(err, errStopping):
		// The next daemon carries on from the log's offset.
	case err != nil:
		c.h.log.Warn("keeping exec output", "sandbox", c.id, "pid", c.pid, "err", err)
	default:
		c.finish(exit)
		return
	}
	c.w.Close()
}

// consume writes what a feeder hands over to the log, a batch at most
// once a batchDelay, until the feeding ends: it returns the exit status if
// it came. Errors are the log's (or errStopping).
func (c *ExecCopy) consume(src <-chan relayed) (*api.ExitStatus, error) {
	var due <-chan time.Time
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		// While a write is due anyway, more pokes change nothing.
		poke := c.poke
		if due != nil {
			poke = nil
		}
		select {
		case f, ok := <-src:
			if !ok {
				return nil, c.ended()
			}
			if exit, done, err := c.take(f); done || err != nil {
				return exit, err
			}
		case <-poke:
			c.out.fetch(c.seen.Load())
		case <-due:
			timer, due = nil, nil
			if err := c.due(); err != nil {
				return nil, err
			}
		case <-c.h.ctx.Done():
			return nil, c.stopping()
		}
		// A batch waits at most batchDelay; so does the record of a
		// process that says nothing (most end sooner, and their record
		// is written once, with the exit).
		if due == nil && c.pending() {
			timer = time.NewTimer(batchDelay)
			due = timer.C
		}
	}
}

// take puts one frame a feeder handed over in the batch. done reports
// that the feeding ended with it, with the exit status if it was the
// exit.
func (c *ExecCopy) take(f relayed) (exit *api.ExitStatus, done bool, err error) {
	switch f.t {
	case wire.Stdout, wire.Stderr:
		c.out.add(f.t, f.off, f.p)
	case wire.Dropped:
		c.out.lost(f.off)
	case wire.Exit:
		c.out.fetch(f.off)
		var st api.ExitStatus
		if err := json.Unmarshal(f.p, &st); err != nil {
			st = api.ExitStatus{ExitCode: -1, Error: "undecodable exit status"}
		}
		return &st, true, c.write(true)
	case wire.Error:
		// Not a process's end: carry on as if the feeder had left.
		c.out.fetch(f.off)
		return nil, true, c.write(true)
	}
	return nil, false, nil
}

// ended writes the batch when a feeding ends before the exit.
func (c *ExecCopy) ended() error {
	c.out.fetch(c.seen.Load())
	return c.write(true)
}

// pending reports whether a write is owed: a batch, or the record of a
// process that has not been saved yet.
func (c *ExecCopy) pending() bool { return !c.out.empty() || !c.saved }

// due writes the batch (and the record, the first time) once it waited
// batchDelay.
func (c *ExecCopy) due() error {
	if !c.saved {
		if err := c.w.Save(); err != nil {
			return err
		}
		c.saved = true
	}
	c.out.fetch(c.seen.Load())
	return c.write(true)
}

// stopping keeps what is in hand when the daemon stops; the next daemon
// fetches the rest.
func (c *ExecCopy) stopping() error {
	if err := c.write(false); err != nil {
		return err
	}
	return errStopping
}

// write puts the batch in the log, fetching the bytes it only counted
// from the guest (unless all is unset), and renews the budget.
func (c *ExecCopy) write(all bool) error {
	defer c.budget.Store(copyBudget)
	skip, spans := c.out.take(all)
	c.w.Skip(skip)
	for _, s := range spans {
		switch s.kind {
		case spanData:
			if err := c.w.Write(s.t, s.p); err != nil {
				return err
			}
		case spanLost:
			c.w.Skip(s.n)
		case spanFetch:
			if err := c.fetch(s.off, s.off+s.n); err != nil {
				return err
			}
		}
	}
	return nil
}

// fetch copies the output between offsets from and to from the guest's
// ring into the log. What the ring no longer holds, or what cannot be
// fetched, is skipped, so that the log's offsets stay the stream's.
func (c *ExecCopy) fetch(from, to int64) error {
	pos, err := c.fetchFrom(from, to)
	if err != nil && c.h.ctx.Err() != nil {
		return errStopping
	}
	if err != nil {
		c.h.log.Debug("fetching exec output", "sandbox", c.id, "pid", c.pid, "from", pos, "to", to, "err", err)
	}
	if pos < to {
		c.w.Skip(to - pos)
	}
	return nil
}

func (c *ExecCopy) fetchFrom(from, to int64) (pos int64, err error) {
	ctx, cancel := context.WithTimeout(c.h.ctx, fetchTimeout)
	defer cancel()
	conn, err := c.gc.Attach(ctx, c.pid, from)
	if err != nil {
		return from, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	for pos = from; pos < to; {
		f, err := conn.Frames.Read()
		if err != nil {
			return pos, err
		}
		switch f.Type {
		case wire.Stdout, wire.Stderr:
			p := f.Payload[:min(int64(len(f.Payload)), to-pos)]
			if err := c.w.Write(f.Type, p); err != nil {
				return pos, err
			}
			pos += int64(len(p))
		case wire.Dropped:
			var d struct {
				Bytes int64 `json:"bytes"`
			}
			if json.Unmarshal(f.Payload, &d) == nil && d.Bytes > 0 {
				n := min(d.Bytes, to-pos)
				c.w.Skip(n)
				pos += n
			}
		default:
			return pos, fmt.Errorf("the stream ended at offset %d", pos)
		}
	}
	return pos, nil
}

// follow attaches to the process at the log's offset and copies its
// output until the exit, then calls end. A stream that breaks ends the
// copy with an exit saying so.
//
// The stream is read through a small buffer (AttachQuiet), and between
// its frames the copy holds no goroutine: the hub's fdnotify.Notifier
// starts one when the connection has input, the batch's timer when the
// batch is due, the hub's stop when the daemon stops. An idle process
// that no client follows (an agent's server, a sleep) then costs the
// daemon a connection and a few small objects for all of its life, not a
// parked goroutine: the runtime never frees a goroutine's descriptor,
// and a thousand such stacks set the peak that the daemon's memory
// stays near after they are gone (issue 21). A connection the notifier
// cannot watch is waited on by a goroutine of its own, as before.
func (c *ExecCopy) follow(end func(*api.ExitStatus, error)) {
	conn, err := c.gc.AttachQuiet(c.h.ctx, c.pid, c.out.logged)
	if err != nil {
		end(c.lost(err))
		return
	}
	f := &follower{c: c, conn: conn, end: end, running: true}
	f.src = feeder{c: c, next: c.out.logged, to: f.take}
	if c.h.notify != nil {
		f.watch, _ = c.h.notify.Watch(conn.Conn)
	}
	f.stop = context.AfterFunc(c.h.ctx, func() {
		conn.Close()
		f.wake(false)
	})
	f.loop()
}

// follower is a copy following its process on a connection of its own.
// Its loop runs on one goroutine at a time: the one that set running.
type follower struct {
	c     *ExecCopy
	conn  *guestapi.Conn
	end   func(*api.ExitStatus, error)
	stop  func() bool     // of the hub's stop closing conn
	watch *fdnotify.Watch // nil: the loop waits on its goroutine
	timer *time.Timer     // wakes the loop when the batch is due
	src   feeder
	exit  *api.ExitStatus
	done  bool
	taken error
	due   time.Time // of the batch's write; zero while none is owed

	mu       sync.Mutex
	running  bool // a goroutine runs the loop
	woken    bool // a wake came while it ran: it must not park yet
	input    bool // the notifier saw input (or the end) since the loop looked
	finished bool
}

// take puts a frame the follower read in the batch.
func (f *follower) take(r relayed) {
	if !f.done && f.taken == nil {
		f.exit, f.done, f.taken = f.c.take(r)
	}
}

// loop copies frames until none is to be read, then parks, or until the
// copy ends.
func (f *follower) loop() {
	for {
		if f.watch != nil && !f.ready() {
			if f.park() {
				return
			}
			continue
		}
		if exit, err, ended := f.step(); ended {
			f.finish(exit, err)
			return
		}
	}
}

// step waits for the next frame (or the batch's time) and takes it;
// ended reports that the copy is over, with the exit or an error.
func (f *follower) step() (exit *api.ExitStatus, err error, ended bool) {
	c := f.c
	werr := f.conn.Wait(f.due)
	if werr == nil {
		var fr wire.Frame
		if fr, werr = f.conn.Frames.Read(); werr == nil {
			f.src.frame(fr.Type, fr.Payload)
		}
	}
	switch {
	case c.h.ctx.Err() != nil:
		return nil, c.stopping(), true
	case errors.Is(werr, os.ErrDeadlineExceeded):
		f.due = time.Time{}
		if err := c.due(); err != nil {
			return nil, err, true
		}
	case werr != nil:
		f.src.close()
		if err := c.ended(); err != nil {
			return nil, err, true
		}
		exit, err = c.lost(werr)
		return exit, err, true
	case f.taken != nil:
		return nil, f.taken, true
	case f.done && f.exit == nil:
		exit, err = c.lost(nil) // an error frame
		return exit, err, true
	case f.done:
		return f.exit, nil, true
	}
	select {
	case <-c.poke:
		c.out.fetch(c.seen.Load())
	default:
	}
	if f.due.IsZero() && c.pending() {
		f.due = time.Now().Add(batchDelay)
	}
	return nil, nil, false
}

// ready reports whether the loop has something to do without waiting:
// a frame to read (or the stream's end), the batch due, the hub
// stopping.
func (f *follower) ready() bool {
	f.mu.Lock()
	input := f.input
	f.input = false
	f.mu.Unlock()
	return input || f.conn.Frames.Buffered() > 0 || f.c.h.ctx.Err() != nil ||
		(!f.due.IsZero() && !time.Now().Before(f.due)) || f.watch.Pending() > 0
}

// park arms the notifier and the batch's timer and lets the goroutine
// go; it reports false when the loop must carry on instead (a wake came
// meanwhile, or the connection cannot be watched: then the loop waits on
// its goroutine from now on).
func (f *follower) park() bool {
	if err := f.watch.Arm(f.onInput); err != nil {
		f.watch.Stop()
		f.watch = nil
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.woken {
		f.woken = false
		return false
	}
	f.running = false
	if !f.due.IsZero() {
		if f.timer == nil {
			f.timer = time.AfterFunc(time.Until(f.due), func() { f.wake(false) })
		} else {
			f.timer.Reset(time.Until(f.due))
		}
	}
	return true
}

func (f *follower) onInput() { f.wake(true) }

// wake runs the loop on the calling goroutine, unless it runs already
// (then it will not park before it has looked again) or is over.
func (f *follower) wake(input bool) {
	f.mu.Lock()
	if input {
		f.input = true
	}
	if f.running || f.finished {
		f.woken = f.running
		f.mu.Unlock()
		return
	}
	f.running = true
	f.mu.Unlock()
	f.loop()
}

// finish lets go of the connection, the watch and the timer, and ends
// the copy.
func (f *follower) finish(exit *api.ExitStatus, err error) {
	f.mu.Lock()
	f.finished = true
	f.mu.Unlock()
	f.stop()
	if f.timer != nil {
		f.timer.Stop()
	}
	if f.watch != nil {
		f.watch.Stop()
	}
	f.conn.Close()
	f.end(exit, err)
}

// lost is how a copy ends when it cannot follow the process any further.
func (c *ExecCopy) lost(err error) (*api.ExitStatus, error) {
	if c.h.ctx.Err() != nil {
		return nil, errStopping
	}
	if err == nil {
		err = errors.New("the stream ended without an exit")
	}
	c.h.log.Debug("exec output copy ended early", "sandbox", c.id, "pid", c.pid, "err", err)
	return &api.ExitStatus{ExitCode: -1, Error: "lost the process: " + err.Error()}, nil
}

// finish records the exit in the exec log and as an exec event.
func (c *ExecCopy) finish(exit *api.ExitStatus) {
	if err := c.w.Finish(*exit); err != nil {
		c.h.log.Warn("recording exec exit", "sandbox", c.id, "pid", c.pid, "err", err)
	}
	d := events.ExecData{Container: c.ctr, PID: c.pid, Cmd: c.cmd, Exited: true, Signal: exit.Signal, OOMKilled: exit.OOMKilled,
		DurationMS: time.Since(c.started).Milliseconds()}
	code := exit.ExitCode
	d.ExitCode = &code
	msg := fmt.Sprintf("pid %d exited with code %d", c.pid, code)
	switch {
	case exit.OOMKilled:
		msg = fmt.Sprintf("pid %d was killed by the OOM killer", c.pid)
	case exit.Signal != "":
		msg = fmt.Sprintf("pid %d was killed by %s", c.pid, exit.Signal)
	case exit.Error != "":
		msg += ": " + exit.Error
	}
	c.h.append(c.id, events.Event{Type: events.Exec, Message: msg, Data: events.Data(d)})
}

// SetGuests sets how the hub reaches the guest of container ctr ("" for
// the first) of a running sandbox, to carry on the output copies a daemon
// restart cut short.
func (h *Hub) SetGuests(f func(ctx context.Context, id, ctr string) (*guestapi.Client, error)) {
	h.mu.Lock()
	h.guests = f
	h.mu.Unlock()
}

// resumeCopies carries on copying the output of sandbox id's processes
// whose copy the last daemon left unfinished; those the guest no longer
// knows are closed with an error. It runs on a goroutine of its own.
func (h *Hub) resumeCopies(id string) {
	ps, err := h.execs.List(id)
	if err != nil {
		return
	}
	open := map[string][]execlog.Process{} // by container
	for _, p := range ps {
		if p.Exit == nil {
			open[p.Container] = append(open[p.Container], p)
		}
	}
	h.mu.Lock()
	guests := h.guests
	h.mu.Unlock()
	if len(open) == 0 || guests == nil {
		return
	}
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	for ctr, procs := range open {
		h.resumeContainer(ctx, id, ctr, guests, procs)
	}
}

// resumeContainer carries on the copies of procs, processes of container
// ctr of sandbox id: each container's guest numbers its own.
func (h *Hub) resumeContainer(ctx context.Context, id, ctr string, guests func(ctx context.Context, id, ctr string) (*guestapi.Client, error), procs []execlog.Process) {
	log := h.log.With("sandbox", id, "container", ctr)
	gc, err := guests(ctx, id, ctr)
	var listed map[int]guestapi.ProcessInfo
	if err == nil {
		var ps []guestapi.ProcessInfo
		if ps, err = gc.Processes(ctx); err == nil {
			listed = map[int]guestapi.ProcessInfo{}
			for _, pi := range ps {
				listed[pi.PID] = pi
			}
		}
	}
	if err != nil {
		log.Warn("resuming exec output copies", "err", err)
		return
	}
	for _, p := range procs {
		w, err := h.execs.Resume(id, p.Seq)
		if err != nil {
			continue // a copy of it runs already
		}
		cut := events.CutCmd(p.Cmd)
		pi, ok := listed[p.PID]
		// A pid the guest reused for a later process is not this one.
		if !ok || pi.StartedAt.Sub(p.StartedAt).Abs() > 5*time.Second {
			w.Finish(api.ExitStatus{ExitCode: -1, Error: "the process was lost while the daemon was down"})
			continue
		}
		c := h.newCopy(id, ctr, gc, p.PID, cut, p.StartedAt)
		h.wg.Add(1)
		go c.run(w, false, h.wg.Done)
	}
}
