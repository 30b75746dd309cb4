package hub

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"paddock/api"
	"paddock/internal/guest"
	"paddock/internal/telemetry/events"
	"paddock/internal/telemetry/execlog"
	"paddock/wire"
)

// ExecCopy is the exec log's copy of one process's output. Whoever reads
// the process's frames anyway (the exec stream the server relays) hands
// them to Frame; when that reader stops before the exit, Detach carries on
// from a connection of the hub's own.
type ExecCopy struct {
	h       *Hub
	id      string
	gc      *guest.Client
	pid     int
	cmd     []string // cut for events
	started time.Time
	w       *execlog.Writer // the copy's goroutine's
	out     *batch          // what is written to w

	// frames go from the feeder to the copy's goroutine, which owns the
	// files, so that the stream never waits on the log's disk work.
	frames chan relayed
	closed bool // the feeder's: frames is closed
}

type relayed struct {
	t wire.Type
	p []byte
}

// ExecStarted records that process pid of sandbox id started running cmd
// and returns the copy of its output: feed it with Frame, and call Detach
// when no longer feeding it. The process's log entry exists when it
// returns (a client may ask for it at once); the copy runs on a goroutine
// of its own.
func (h *Hub) ExecStarted(id string, gc *guest.Client, pid int, cmd []string) *ExecCopy {
	c := &ExecCopy{h: h, id: id, gc: gc, pid: pid, cmd: events.CutCmd(cmd), started: time.Now(), frames: make(chan relayed, 64)}
	h.append(c.id, events.Event{Type: events.Exec, Message: "started " + strings.Join(c.cmd, " "),
		Data: events.Data(events.ExecData{PID: c.pid, Cmd: c.cmd})})
	w, err := h.execs.Start(c.id, c.pid, cmd, c.started)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		c.run(w, err)
	}()
	return c
}

// Frame copies one frame of the process's stream. It never waits for the
// log's disk work: the stream is a hot path. When the copy falls behind
// (its queue is full), the feeding stops and the copy carries on from the
// guest's own output buffer at its offset, as when a client leaves early.
func (c *ExecCopy) Frame(t wire.Type, payload []byte) {
	if c.closed {
		return
	}
	select {
	case c.frames <- relayed{t, bytes.Clone(payload)}:
	default:
		c.Detach()
		return
	}
	if t == wire.Exit || t == wire.Error {
		c.Detach()
	}
}

// Detach ends the feeding: if the exit has not come, a connection of the
// hub's own attaches where the copy is and carries on to the exit.
func (c *ExecCopy) Detach() {
	if !c.closed {
		c.closed = true
		close(c.frames)
	}
}

// run writes what the feeder hands over to w (the log entry, or err if
// it could not be made) and, if the feeder stopped before the exit,
// follows the process itself.
func (c *ExecCopy) run(w *execlog.Writer, err error) {
	h := c.h
	if err != nil {
		h.log.Warn("keeping exec output", "sandbox", c.id, "pid", c.pid, "err", err)
	} else {
		c.w, c.out = w, newBatch(w, h.execs.ProcessCap())
	}
	failed, exited := err != nil, false
	for {
		var f relayed
		var ok bool
		select {
		case f, ok = <-c.frames:
		case <-h.ctx.Done():
			// The daemon is stopping while the stream goes on: leave the
			// copy unfinished for the next daemon to resume.
			if !failed && !exited {
				c.out.stop()
				w.Close()
			}
			return
		}
		if !ok {
			break
		}
		if failed || exited {
			continue
		}
		exit, err := c.frame(f.t, f.p)
		switch {
		case err != nil:
			h.log.Warn("keeping exec output", "sandbox", c.id, "pid", c.pid, "err", err)
			failed = true
			c.out.stop()
			w.Close()
		case exit != nil:
			exited = true
			c.finish(exit)
		}
	}
	if !failed && !exited {
		// The follower attaches at the log's offset: everything held
		// must be in the log first.
		if err := c.out.flush(); err != nil {
			h.log.Warn("keeping exec output", "sandbox", c.id, "pid", c.pid, "err", err)
			c.out.stop()
			w.Close()
			return
		}
		c.follow()
	}
}

func (c *ExecCopy) frame(t wire.Type, payload []byte) (*api.ExitStatus, error) {
	switch t {
	case wire.Stdout, wire.Stderr:
		c.out.add(t, payload)
	case wire.Dropped:
		var d struct {
			Bytes int64 `json:"bytes"`
		}
		if json.Unmarshal(payload, &d) == nil {
			c.out.dropped(d.Bytes)
		}
	case wire.Exit:
		var st api.ExitStatus
		if err := json.Unmarshal(payload, &st); err != nil {
			return nil, fmt.Errorf("decoding exit status: %w", err)
		}
		return &st, nil
	case wire.Error:
		return nil, fmt.Errorf("guest: %s", payload)
	}
	return nil, nil
}

// follow attaches to the process at the copy's offset and copies frames
// until the exit.
func (c *ExecCopy) follow() {
	exit, err := c.h.pump(c)
	if err != nil {
		if c.h.ctx.Err() != nil {
			c.out.stop()
			c.w.Close() // the daemon is stopping; the next one resumes
			return
		}
		c.h.log.Debug("exec output copy ended early", "sandbox", c.id, "pid", c.pid, "err", err)
		exit = &api.ExitStatus{ExitCode: -1, Error: "lost the process: " + err.Error()}
	}
	c.finish(exit)
}

// finish records the exit in the exec log and as an exec event.
func (c *ExecCopy) finish(exit *api.ExitStatus) {
	if err := c.out.stop(); err != nil {
		c.h.log.Warn("keeping exec output", "sandbox", c.id, "pid", c.pid, "err", err)
	}
	if err := c.w.Finish(*exit); err != nil {
		c.h.log.Warn("recording exec exit", "sandbox", c.id, "pid", c.pid, "err", err)
	}
	d := events.ExecData{PID: c.pid, Cmd: c.cmd, Exited: true, Signal: exit.Signal, OOMKilled: exit.OOMKilled,
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

func (h *Hub) pump(c *ExecCopy) (*api.ExitStatus, error) {
	_, conn, err := c.gc.Call(h.ctx, guest.Request{Op: guest.OpAttach, PID: c.pid, Offset: c.w.Offset()})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(h.ctx, func() { conn.Close() })
	defer stop()
	for {
		f, err := conn.Frames.Read()
		if err != nil {
			return nil, err
		}
		p := f.Payload
		if f.Type == wire.Stdout || f.Type == wire.Stderr {
			p = bytes.Clone(p) // held in the batch past the next Read
		}
		if exit, err := c.frame(f.Type, p); err != nil || exit != nil {
			return exit, err
		}
	}
}

// SetGuests sets how the hub reaches a running sandbox's guest, to carry
// on the output copies a daemon restart cut short.
func (h *Hub) SetGuests(f func(ctx context.Context, id string) (*guest.Client, error)) {
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
	var open []execlog.Process
	for _, p := range ps {
		if p.Exit == nil {
			open = append(open, p)
		}
	}
	h.mu.Lock()
	guests := h.guests
	h.mu.Unlock()
	if len(open) == 0 || guests == nil {
		return
	}
	log := h.log.With("sandbox", id)
	ctx, cancel := context.WithTimeout(h.ctx, 30*time.Second)
	defer cancel()
	gc, err := guests(ctx, id)
	var listed map[int]guest.ProcessInfo
	if err == nil {
		var resp *guest.Response
		if resp, err = gc.Do(ctx, guest.Request{Op: guest.OpList}); err == nil {
			listed = map[int]guest.ProcessInfo{}
			for _, pi := range resp.Processes {
				listed[pi.PID] = pi
			}
		}
	}
	if err != nil {
		log.Warn("resuming exec output copies", "err", err)
		return
	}
	for _, p := range open {
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
		c := &ExecCopy{h: h, id: id, gc: gc, pid: p.PID, cmd: cut, started: p.StartedAt, w: w, out: newBatch(w, h.execs.ProcessCap())}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			c.follow()
		}()
	}
}
