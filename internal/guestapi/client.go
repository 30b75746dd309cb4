package guestapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/wire"
)

// Client talks to one sandbox's guest from the daemon. Each call has a
// connection on the control socket to itself, so calls are independent
// and a dropped stream never affects another.
//
// A connection whose process stream ended with its exit is released back
// to the guest (wire.Release) and kept for a later call; with none kept,
// one is dialled ahead when a call's connection closes, and by DialAhead
// when the sandbox starts, so that a call seldom waits for a connect and
// the guest's accept.
type Client struct {
	dial func(ctx context.Context) (net.Conn, error)
	// turn, when set, is waited for before each process start (WithTurns).
	turn Turn

	mu     sync.Mutex
	idle   []net.Conn // released or dialled ahead, newest last
	closed bool
	// noReuse: a released connection was found closed (a guest from
	// before releases): streams are closed, not kept, from then on.
	noReuse atomic.Bool
}

// maxIdle bounds the connections a Client keeps: each holds a goroutine
// and an fd in the guest.
const maxIdle = 4

// NewClient returns a Client that connects with dial.
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	return &Client{dial: dial}
}

// Turn waits until the node lets a process start (internal/turns);
// release gives it back.
type Turn func(ctx context.Context) (release func(), err error)

// WithTurns makes every process start of c wait for turn, and hold it
// until the guest answers the start. It is set before c's first call.
func (c *Client) WithTurns(turn Turn) *Client {
	c.turn = turn
	return c
}

// takeTurn waits for c's turn to start a process.
func (c *Client) takeTurn(ctx context.Context) (release func(), err error) {
	if c.turn == nil {
		return func() {}, nil
	}
	return c.turn(ctx)
}

// connect returns a kept connection (kept: true), or dials one.
func (c *Client) connect(ctx context.Context) (conn net.Conn, kept bool, err error) {
	c.mu.Lock()
	if n := len(c.idle); n > 0 {
		conn = c.idle[n-1]
		c.idle = c.idle[:n-1]
	}
	c.mu.Unlock()
	if conn != nil {
		return conn, true, nil
	}
	conn, err = c.dial(ctx)
	return conn, false, err
}

// keep adds conn to the kept connections, or closes it if there are
// enough or the Client is closed.
func (c *Client) keep(conn net.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.idle) >= maxIdle {
		conn.Close()
		return
	}
	c.idle = append(c.idle, conn)
}

// DialAhead dials a connection to keep if none is kept: after a call's
// connection closes, and when a sandbox starts, so that its first call
// finds the guest's accept done (0.25 ms off its first command's output,
// median of 6 alternating blocks of 40 creates).
func (c *Client) DialAhead() {
	c.mu.Lock()
	enough := c.closed || len(c.idle) > 0
	c.mu.Unlock()
	if enough {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if conn, err := c.dial(ctx); err == nil {
		c.keep(conn)
	}
}

// Close drops the kept connections; calls made afterwards still work.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for _, conn := range c.idle {
		conn.Close()
	}
	c.idle = nil
}

// readers recycles the connections' read buffers: a fresh 64 KiB buffer
// per call costs more in page faults than the call itself on small VMs.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readerSize) }}

// readerSize is a call's read buffer: an exec's output streams through
// it.
const readerSize = 64 << 10

// quietReaderSize is the read buffer of a stream expected to stay quiet
// for long (AttachQuiet): a frame's payload beyond it is read straight
// into the frame, so only a stream of many small frames pays for it,
// with more reads. Each idle sandbox whose process runs holds one: at 4
// KiB it was a fifth of the daemon's live heap per idle sandbox, and the
// peak heap sets what the Go runtime keeps after the sandboxes are gone
// (issue 21).
const quietReaderSize = 1 << 10

// reportReaderSize is the read buffer of a lane's report connection,
// kept for as long as the client keeps the lane: its frames are small
// (an exec's start, output batches read past it straight into the
// frame, the exit), and a call's 64 KiB for each lane a client keeps
// open was most of what the daemon held per sandbox (issue 21).
const reportReaderSize = 4 << 10

// Conn is an open guest connection after its request was answered: for
// streaming ops, the output frames follow on Frames and input frames go
// out with Send.
type Conn struct {
	net.Conn
	Frames *wire.Reader
	out    *wire.Writer
	br     *bufio.Reader
	client *Client
	once   sync.Once
	// released: the connection is the Client's again; Close leaves it.
	released atomic.Bool
}

// Close closes the connection, recycles its buffer and has a connection
// dialled ahead if none is kept. After Release it does nothing.
func (c *Conn) Close() error {
	if c.released.Load() {
		return nil
	}
	err := c.Conn.Close()
	c.once.Do(func() {
		c.recycle()
		go c.client.DialAhead()
	})
	return err
}

// Release ends a process stream whose exit frame the caller has read, and
// keeps the connection for a later call; when that is not possible (more
// bytes arrived, the write fails) it closes it. No one may write to the
// connection meanwhile (an upgraded stream's input relay).
func (c *Conn) Release() {
	if c.client.noReuse.Load() || c.Frames.Buffered() > 0 || c.out.Write(wire.Release, nil) != nil {
		c.Close()
		return
	}
	c.once.Do(func() {
		c.released.Store(true)
		c.recycle()
		c.client.keep(c.Conn)
	})
}

func (c *Conn) recycle() {
	if c.br.Size() != readerSize {
		return // a report connection's own (HandLane)
	}
	c.br.Reset(nil)
	readers.Put(c.br)
}

// Wait waits until the next frame starts to arrive, or until deadline
// passes (an error matching os.ErrDeadlineExceeded; a zero deadline
// waits as long as it takes), and consumes nothing: a reader can wait
// for output and for a timer of its own on one goroutine without a read
// deadline cutting a frame in two.
func (c *Conn) Wait(deadline time.Time) error {
	if c.br.Buffered() > 0 {
		return nil
	}
	if err := c.Conn.SetReadDeadline(deadline); err != nil {
		return err
	}
	_, err := c.br.Peek(1)
	if !deadline.IsZero() {
		if derr := c.Conn.SetReadDeadline(time.Time{}); err == nil {
			err = derr
		}
	}
	return err
}

// Send writes one frame to the guest.
func (c *Conn) Send(t wire.Type, payload []byte) error { return c.out.Write(t, payload) }

// request sends req and returns the guest's response and the open
// connection (the caller closes or releases it). A kept connection that turns out
// closed (its guest from before connections were kept, or gone) before
// the request is answered is dropped and the request sent on a new one.
func (c *Client) request(ctx context.Context, req Request) (*Response, *Conn, error) {
	return c.requestWith(ctx, req, func() *bufio.Reader { return readers.Get().(*bufio.Reader) })
}

// requestWith is request reading the answer and the stream through a
// reader from newReader.
func (c *Client) requestWith(ctx context.Context, req Request, newReader func() *bufio.Reader) (*Response, *Conn, error) {
	for {
		conn, kept, err := c.connect(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("connecting to guest: %w", err)
		}
		resp, gc, stale, err := c.callWith(ctx, conn, newReader(), req)
		if kept && stale && ctx.Err() == nil {
			c.noReuse.Store(true)
			continue
		}
		return resp, gc, err
	}
}

// callWith sends req on conn and reads the answer through br. stale
// reports that the connection was closed before the request could be
// answered.
func (c *Client) callWith(ctx context.Context, conn net.Conn, br *bufio.Reader, req Request) (_ *Response, _ *Conn, stale bool, _ error) {
	br.Reset(conn)
	gc := &Conn{Conn: conn, Frames: wire.NewReader(br), out: wire.NewWriter(conn), br: br, client: c}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := gc.out.WriteJSON(wire.Request, req); err != nil {
		gc.Close()
		return nil, nil, true, fmt.Errorf("sending request to guest: %w", err)
	}
	f, err := gc.Frames.Read()
	if err != nil {
		gc.Close()
		if ctx.Err() != nil {
			return nil, nil, false, ctx.Err()
		}
		stale := br.Buffered() == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET))
		return nil, nil, stale, fmt.Errorf("reading guest response: %w", err)
	}
	if f.Type != wire.Response {
		gc.Close()
		return nil, nil, false, fmt.Errorf("guest answered with frame type %d", f.Type)
	}
	var resp Response
	if err := json.Unmarshal(f.Payload, &resp); err != nil {
		gc.Close()
		return nil, nil, false, fmt.Errorf("decoding guest response: %w", err)
	}
	if resp.Error != nil {
		gc.Close()
		cat := errdefs.FromCode(resp.Error.Code)
		if cat == nil {
			return nil, nil, false, fmt.Errorf("guest: %s", resp.Error.Message)
		}
		return nil, nil, false, fmt.Errorf("%w: %s", cat, stripCategory(resp.Error.Message, cat))
	}
	return &resp, gc, false, nil
}

// do sends a request that needs no stream and returns the response.
func (c *Client) do(ctx context.Context, req Request) (*Response, error) {
	resp, conn, err := c.request(ctx, req)
	if err != nil {
		return nil, err
	}
	conn.Close()
	return resp, nil
}

// stripCategory removes the "not found: " prefix that the category's
// own wrapping adds back.
func stripCategory(msg string, cat error) string {
	p := cat.Error() + ": "
	if len(msg) >= len(p) && msg[:len(p)] == p {
		return msg[len(p):]
	}
	return msg
}

// HandLane hands lane, a client's connection upgraded to an exec lane
// bound to sandbox id, to the guest (OpLane: the answer, then one byte
// carrying the socket), and returns the connection on which the guest
// reports the lane's execs; closing it closes the lane after its exec in
// flight. The caller closes its own descriptor of lane, and must never
// shut the socket down: the guest's shares it.
func (c *Client) HandLane(ctx context.Context, id string, lane syscall.Conn) (*Conn, error) {
	raw, err := lane.SyscallConn()
	if err != nil {
		return nil, err
	}
	// A connection of its own: it becomes the lane's report connection.
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("connecting to guest: %w", err)
	}
	sock := conn
	if w, ok := conn.(interface{ NetConn() net.Conn }); ok {
		sock = w.NetConn() // dialled while the guest activated
	}
	uc, ok := sock.(*net.UnixConn)
	if !ok {
		conn.Close()
		return nil, errors.New("the guest connection is not a unix socket")
	}
	_, gc, _, err := c.callWith(ctx, conn, bufio.NewReaderSize(nil, reportReaderSize), Request{Op: OpLane, Sandbox: id})
	if err != nil {
		return nil, err
	}
	var werr error
	err = raw.Control(func(fd uintptr) {
		_, _, werr = uc.WriteMsgUnix([]byte{0}, syscall.UnixRights(int(fd)), nil)
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		gc.Close()
		return nil, fmt.Errorf("handing the lane to the guest: %w", err)
	}
	return gc, nil
}

// Quiesce has the guest close its control socket (OpQuiesce) and returns
// once it has closed this call's connection too: the guest then holds no
// socket of the host's. The client's kept connections are dropped.
func (c *Client) Quiesce(ctx context.Context) error {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, conn := range idle {
		conn.Close()
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	_, gc, _, err := c.callWith(ctx, conn, bufio.NewReader(conn), Request{Op: OpQuiesce})
	if err != nil {
		return err
	}
	defer gc.Conn.Close()
	stop := context.AfterFunc(ctx, func() { gc.Conn.Close() })
	defer stop()
	// The guest sends nothing more: the read ends when it closes.
	if _, err := io.Copy(io.Discard, gc.br); err != nil || ctx.Err() != nil {
		return fmt.Errorf("waiting for the guest to close its sockets: %w", errors.Join(err, ctx.Err()))
	}
	return nil
}
