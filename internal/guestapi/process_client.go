package guestapi

import (
	"bufio"
	"context"
	"strconv"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

// The process ops, one method each. A process is named by its pid in the
// guest's namespace; the guest keeps finished ones (their exit and
// output) for reattach.

// Start starts a process in the background and returns its pid. It
// clears s.Attach: StartAttached streams the output.
func (c *Client) Start(ctx context.Context, s *StartRequest) (int, error) {
	s.Attach = false
	release, err := c.takeTurn(ctx)
	if err != nil {
		return 0, err
	}
	resp, err := c.do(ctx, Request{Op: OpStart, Start: s})
	release()
	if err != nil {
		return 0, err
	}
	return resp.PID, nil
}

// StartAttached starts a process and returns its pid and the connection
// its output comes on: wire frames ending with its exit frame, input
// frames going the other way (Conn.Send). It sets s.Attach. The caller
// closes or releases conn. The turn (WithTurns) is held until the guest
// answers, which it does with a short command's output and exit.
func (c *Client) StartAttached(ctx context.Context, s *StartRequest) (int, *Conn, error) {
	s.Attach = true
	release, err := c.takeTurn(ctx)
	if err != nil {
		return 0, nil, err
	}
	resp, conn, err := c.request(ctx, Request{Op: OpStart, Start: s})
	release()
	if err != nil {
		return 0, nil, err
	}
	return resp.PID, conn, nil
}

// Attach streams process pid's output from offset (bytes of stdout and
// stderr together since it started) on the returned connection, as
// StartAttached does.
func (c *Client) Attach(ctx context.Context, pid int, offset int64) (*Conn, error) {
	_, conn, err := c.request(ctx, Request{Op: OpAttach, PID: pid, Offset: offset})
	return conn, err
}

// AttachQuiet is Attach for a stream that may stay quiet for long (the
// exec log's copy of a process no client follows): its connection reads
// through a 1 KiB buffer rather than a call's 64 KiB, which an idle
// sandbox would otherwise hold for as long as its process runs (issue
// 21: the daemon's memory per sandbox).
func (c *Client) AttachQuiet(ctx context.Context, pid int, offset int64) (*Conn, error) {
	_, conn, err := c.requestWith(ctx, Request{Op: OpAttach, PID: pid, Offset: offset},
		func() *bufio.Reader { return bufio.NewReaderSize(nil, quietReaderSize) })
	return conn, err
}

// Processes lists the processes the guest started, running and
// finished.
func (c *Client) Processes(ctx context.Context) ([]ProcessInfo, error) {
	resp, err := c.do(ctx, Request{Op: OpList})
	if err != nil {
		return nil, err
	}
	return resp.Processes, nil
}

// Process describes process pid; one the guest does not know is an
// errdefs.ErrNotFound.
func (c *Client) Process(ctx context.Context, pid int) (ProcessInfo, error) {
	ps, err := c.Processes(ctx)
	if err != nil {
		return ProcessInfo{}, err
	}
	for _, p := range ps {
		if p.PID == pid {
			return p, nil
		}
	}
	return ProcessInfo{}, errdefs.NotFound("process", strconv.Itoa(pid))
}

// Signal sends signal ("SIGTERM", "TERM" or a number) to process pid's
// group.
func (c *Client) Signal(ctx context.Context, pid int, signal string) error {
	_, err := c.do(ctx, Request{Op: OpSignal, PID: pid, Signal: signal})
	return err
}

// Input writes data to process pid's stdin.
func (c *Client) Input(ctx context.Context, pid int, data []byte) error {
	_, err := c.do(ctx, Request{Op: OpInput, PID: pid, Data: data})
	return err
}

// CloseStdin closes process pid's stdin.
func (c *Client) CloseStdin(ctx context.Context, pid int) error {
	_, err := c.do(ctx, Request{Op: OpCloseStdin, PID: pid})
	return err
}

// Resize sets the size of process pid's terminal.
func (c *Client) Resize(ctx context.Context, pid int, tty api.TTY) error {
	_, err := c.do(ctx, Request{Op: OpResize, PID: pid, TTY: &tty})
	return err
}

// Ping checks that the guest answers.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.do(ctx, Request{Op: OpPing})
	return err
}

// SetEnv replaces variables (KEY=VALUE) of the environment the guest
// gives new processes (OpSetEnv).
func (c *Client) SetEnv(ctx context.Context, env []string) error {
	_, err := c.do(ctx, Request{Op: OpSetEnv, Env: env})
	return err
}
