package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/wire"
)

// ExecIO connects an exec to local streams. Nil writers discard output.
type ExecIO struct {
	// Stdin, when set, is streamed to the process and closed at EOF.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// OnStart is called with the process id once it runs.
	OnStart func(pid int)
}

// Exec runs a command in a sandbox, streaming its output to io, and
// returns how it ended. A non-zero exit is not an error; an error means the
// command could not be run or its stream was lost. When ctx ends, Exec
// returns; the process keeps running in the sandbox.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest, eio ExecIO) (*api.ExitStatus, error) {
	if eio.Stdin == nil && req.TTY == nil && containerOf(ctx) == "" {
		if st, ok, err := c.execLane(ctx, id, req, eio); ok {
			return st, err
		}
	}
	s, err := c.ExecStream(ctx, id, req, eio.Stdin != nil)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if eio.OnStart != nil {
		eio.OnStart(s.PID)
	}
	if eio.Stdin != nil {
		go func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := eio.Stdin.Read(buf)
				if n > 0 {
					if s.Send(wire.Stdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					s.Send(wire.CloseStdin, nil)
					return
				}
			}
		}()
	}
	return s.Wait(eio.Stdout, eio.Stderr)
}

// ExecStream is a process's open output stream (from an exec or an
// attach), for callers that need more than Exec: input, signals and
// terminal sizes as they go, and the offset to re-attach from.
type ExecStream struct {
	PID  int
	body io.ReadCloser
	fr   *wire.Reader
	off  int64 // output bytes received (and dropped) so far
	// eofOK: the stream may end without an exit frame (a kept log of a
	// process still running); Wait then returns a nil status.
	eofOK bool
	// lane: the stream is on an exec lane, which goes on after the exit
	// frame (there is no body end to read to).
	lane bool

	mu sync.Mutex
	fw *wire.Writer // nil on a one-way stream
}

// ExecStream starts a command and returns its stream. With interactive set
// the connection is upgraded so that input and signals can be sent.
func (c *Client) ExecStream(ctx context.Context, id string, req api.ExecRequest, interactive bool) (*ExecStream, error) {
	return c.openStream(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", req, interactive)
}

// openStream sends a request whose answer is a frame stream.
func (c *Client) openStream(ctx context.Context, method, path string, body any, interactive bool) (*ExecStream, error) {
	hreq, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	if interactive {
		hreq.Header.Set("Connection", "Upgrade")
		hreq.Header.Set("Upgrade", api.StreamProtocol)
	}
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	pid, _ := strconv.Atoi(resp.Header.Get("X-Paddock-Pid"))
	s := &ExecStream{PID: pid, body: resp.Body, fr: wire.NewReader(resp.Body)}
	if interactive {
		rw, ok := resp.Body.(io.ReadWriteCloser)
		if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
			resp.Body.Close()
			return nil, fmt.Errorf("daemon did not upgrade the exec stream (status %d)", resp.StatusCode)
		}
		s.fw = wire.NewWriter(rw)
	}
	return s, nil
}

// Send sends an input frame (wire.Stdin, wire.CloseStdin, wire.Signal).
func (s *ExecStream) Send(t wire.Type, payload []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fw == nil {
		return errors.New("exec stream is not interactive")
	}
	return s.fw.Write(t, payload)
}

// Signal sends a signal ("TERM", "KILL", "INT", ...) to the process.
func (s *ExecStream) Signal(sig string) error {
	b, _ := json.Marshal(api.SignalRequest{Signal: sig})
	return s.Send(wire.Signal, b)
}

// Resize sets the size of the process's terminal.
func (s *ExecStream) Resize(cols, rows uint16) error {
	b, _ := json.Marshal(api.TTY{Cols: cols, Rows: rows})
	return s.Send(wire.Resize, b)
}

// Offset is how much output the stream has delivered (or reported
// dropped): attach from here to resume after a lost connection.
func (s *ExecStream) Offset() int64 { return s.off }

// Wait copies output until the exit frame and returns the exit status.
func (s *ExecStream) Wait(stdout, stderr io.Writer) (*api.ExitStatus, error) {
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for {
		f, err := s.fr.Read()
		if err == io.EOF && s.eofOK {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading exec stream: %w", err)
		}
		switch f.Type {
		case wire.Stdout:
			s.off += int64(len(f.Payload))
			if _, err := stdout.Write(f.Payload); err != nil {
				return nil, err
			}
		case wire.Stderr:
			s.off += int64(len(f.Payload))
			if _, err := stderr.Write(f.Payload); err != nil {
				return nil, err
			}
		case wire.Dropped:
			var d struct {
				Bytes int64 `json:"bytes"`
			}
			json.Unmarshal(f.Payload, &d)
			s.off += d.Bytes
		case wire.Exit:
			var st api.ExitStatus
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				return nil, fmt.Errorf("decoding exit status: %w", err)
			}
			s.drain()
			return &st, nil
		case wire.Error:
			var e api.Error
			json.Unmarshal(f.Payload, &e)
			return nil, &Error{Code: e.Code, Message: e.Message}
		}
	}
}

// drain reads a one-way stream's body to its end after the exit frame, so
// that the HTTP connection goes back to the pool instead of being closed
// (the daemon ends the body right after that frame).
func (s *ExecStream) drain() {
	if s.fw == nil && !s.lane {
		io.Copy(io.Discard, io.LimitReader(s.body, 64<<10))
	}
}

// Close closes the stream; the process keeps running.
func (s *ExecStream) Close() error { return s.body.Close() }
