package hub

import (
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

// ExecStarted records that process pid of sandbox id started running cmd
// and copies its output, as it comes, into the exec log from a connection
// of its own to the guest; its exit becomes an exec event with the exit
// code and run time. The copy outlives the request that started the
// process.
func (h *Hub) ExecStarted(id string, gc *guest.Client, pid int, cmd []string) {
	now := time.Now()
	cut := events.CutCmd(cmd)
	h.append(id, events.Event{Type: events.Exec, Message: "started " + strings.Join(cut, " "),
		Data: events.Data(events.ExecData{PID: pid, Cmd: cut})})
	w, err := h.execs.Start(id, pid, cmd, now)
	if err != nil {
		h.log.Warn("keeping exec output", "sandbox", id, "pid", pid, "err", err)
		return
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.copyOutput(id, gc, pid, cut, now, w)
	}()
}

// copyOutput attaches to the process at the writer's offset and copies
// frames until the exit frame.
func (h *Hub) copyOutput(id string, gc *guest.Client, pid int, cmd []string, started time.Time, w *execlog.Writer) {
	log := h.log.With("sandbox", id, "pid", pid)
	exit, err := h.pump(gc, pid, w)
	if err != nil {
		if h.ctx.Err() != nil {
			w.Close() // the daemon is stopping
			return
		}
		log.Debug("exec output copy ended early", "err", err)
		exit = &api.ExitStatus{ExitCode: -1, Error: "lost the process: " + err.Error()}
	}
	if err := w.Finish(*exit); err != nil {
		log.Warn("recording exec exit", "err", err)
	}
	d := events.ExecData{PID: pid, Cmd: cmd, Exited: true, Signal: exit.Signal, OOMKilled: exit.OOMKilled,
		DurationMS: time.Since(started).Milliseconds()}
	code := exit.ExitCode
	d.ExitCode = &code
	msg := fmt.Sprintf("pid %d exited with code %d", pid, code)
	switch {
	case exit.OOMKilled:
		msg = fmt.Sprintf("pid %d was killed by the OOM killer", pid)
	case exit.Signal != "":
		msg = fmt.Sprintf("pid %d was killed by %s", pid, exit.Signal)
	case exit.Error != "":
		msg += ": " + exit.Error
	}
	h.append(id, events.Event{Type: events.Exec, Message: msg, Data: events.Data(d)})
}

func (h *Hub) pump(gc *guest.Client, pid int, w *execlog.Writer) (*api.ExitStatus, error) {
	_, conn, err := gc.Call(h.ctx, guest.Request{Op: guest.OpAttach, PID: pid, Offset: w.Offset()})
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
		switch f.Type {
		case wire.Stdout, wire.Stderr:
			if err := w.Write(f.Type, f.Payload); err != nil {
				return nil, err
			}
		case wire.Dropped:
			var d struct {
				Bytes int64 `json:"bytes"`
			}
			if json.Unmarshal(f.Payload, &d) == nil {
				w.Skip(d.Bytes)
			}
		case wire.Exit:
			var st api.ExitStatus
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return nil, fmt.Errorf("decoding exit status: %w", err)
			}
			return &st, nil
		case wire.Error:
			return nil, fmt.Errorf("guest: %s", f.Payload)
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
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.copyOutput(id, gc, p.PID, cut, p.StartedAt, w)
		}()
	}
}
