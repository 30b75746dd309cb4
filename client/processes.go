package client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/paddock-dev/paddock/api"
)

func processPath(id string, pid int, rest string) string {
	p := "/v1/sandboxes/" + url.PathEscape(id) + "/processes"
	if pid > 0 {
		p += "/" + strconv.Itoa(pid)
	}
	return p + rest
}

// StartProcess starts a command in the background and returns at once;
// attach to it with Attach.
func (c *Client) StartProcess(ctx context.Context, id string, req api.StartRequest) (*api.Process, error) {
	var p api.Process
	return &p, c.do(ctx, http.MethodPost, processPath(id, 0, ""), req, &p)
}

// Processes lists the processes started in a sandbox, running and
// recently finished, oldest first.
func (c *Client) Processes(ctx context.Context, id string) ([]api.Process, error) {
	var out []api.Process
	return out, c.do(ctx, http.MethodGet, processPath(id, 0, ""), nil, &out)
}

// Process returns one process.
func (c *Client) Process(ctx context.Context, id string, pid int) (*api.Process, error) {
	var p api.Process
	return &p, c.do(ctx, http.MethodGet, processPath(id, pid, ""), nil, &p)
}

// AttachOptions tune Attach.
type AttachOptions struct {
	// Offset replays output from this byte offset (stdout and stderr
	// together); 0 replays everything still retained.
	Offset int64
	// Interactive upgrades the connection so that input, signals and
	// terminal sizes can be sent on the stream.
	Interactive bool
}

// Attach streams a running or finished process's output from an offset,
// ending with its exit status: after a dropped connection, a daemon
// restart, or for a process started in the background.
func (c *Client) Attach(ctx context.Context, id string, pid int, opts AttachOptions) (*ExecStream, error) {
	path := processPath(id, pid, "/stream")
	if opts.Offset > 0 {
		path += "?offset=" + strconv.FormatInt(opts.Offset, 10)
	}
	return c.openStream(ctx, http.MethodGet, path, nil, opts.Interactive)
}

// SendInput writes r to the process's stdin; with closeAfter its stdin is
// closed at the end.
func (c *Client) SendInput(ctx context.Context, id string, pid int, r io.Reader, closeAfter bool) error {
	path := processPath(id, pid, "/stdin")
	if closeAfter {
		path += "?close=true"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+inContainer(ctx, path), r)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return readError(resp)
	}
	return nil
}

// SendInputBytes is SendInput for a byte slice.
func (c *Client) SendInputBytes(ctx context.Context, id string, pid int, b []byte, closeAfter bool) error {
	return c.SendInput(ctx, id, pid, bytes.NewReader(b), closeAfter)
}

// CloseStdin closes the process's stdin (sends ^D to a terminal).
func (c *Client) CloseStdin(ctx context.Context, id string, pid int) error {
	return c.do(ctx, http.MethodPost, processPath(id, pid, "/close-stdin"), nil, nil)
}

// Signal sends a signal ("TERM", "KILL", "INT", a number...) to the
// process's group.
func (c *Client) Signal(ctx context.Context, id string, pid int, sig string) error {
	return c.do(ctx, http.MethodPost, processPath(id, pid, "/signal"), api.SignalRequest{Signal: sig}, nil)
}

// Resize sets the size of the process's terminal.
func (c *Client) Resize(ctx context.Context, id string, pid int, cols, rows uint16) error {
	return c.do(ctx, http.MethodPost, processPath(id, pid, "/resize"), api.TTY{Cols: cols, Rows: rows}, nil)
}
