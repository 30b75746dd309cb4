package guest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"

	"paddock/internal/errdefs"
	"paddock/wire"
)

// Client talks to one sandbox's guest from the daemon. Each call opens its
// own connection on the control socket, so calls are independent and a
// dropped stream never affects another.
//
// One connection is kept dialled ahead, so that a call does not wait for
// the connect and the guest's accept. The next is dialled when a call's
// connection closes, not while the call's command runs.
type Client struct {
	dial func(ctx context.Context) (net.Conn, error)

	mu     sync.Mutex
	spare  net.Conn
	closed bool
}

// NewClient returns a Client that connects with dial.
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	return &Client{dial: dial}
}

// connect returns the spare connection, or dials one.
func (c *Client) connect(ctx context.Context) (net.Conn, error) {
	c.mu.Lock()
	conn := c.spare
	c.spare = nil
	c.mu.Unlock()
	if conn != nil {
		return conn, nil
	}
	return c.dial(ctx)
}

func (c *Client) dialSpare() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := c.dial(ctx)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spare != nil || c.closed {
		conn.Close()
		return
	}
	c.spare = conn
}

// Close drops the spare connection; calls made afterwards still work.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.spare != nil {
		c.spare.Close()
		c.spare = nil
	}
}

// readers recycles the connections' read buffers: a fresh 64 KiB buffer
// per call costs more in page faults than the call itself on small VMs.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

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
}

// Close closes the connection, recycles its buffer and has the next
// spare dialled.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.br.Reset(nil)
		readers.Put(c.br)
		go c.client.dialSpare()
	})
	return err
}

// Send writes one frame to the guest.
func (c *Conn) Send(t wire.Type, payload []byte) error { return c.out.Write(t, payload) }

// Call sends req and returns the guest's response and the open connection
// (the caller closes it).
func (c *Client) Call(ctx context.Context, req Request) (*Response, *Conn, error) {
	conn, err := c.connect(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("connecting to guest: %w", err)
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(conn)
	gc := &Conn{Conn: conn, Frames: wire.NewReader(br), out: wire.NewWriter(conn), br: br, client: c}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := gc.out.WriteJSON(wire.Request, req); err != nil {
		gc.Close()
		return nil, nil, fmt.Errorf("sending request to guest: %w", err)
	}
	f, err := gc.Frames.Read()
	if err != nil {
		gc.Close()
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, fmt.Errorf("reading guest response: %w", err)
	}
	if f.Type != wire.Response {
		gc.Close()
		return nil, nil, fmt.Errorf("guest answered with frame type %d", f.Type)
	}
	var resp Response
	if err := json.Unmarshal(f.Payload, &resp); err != nil {
		gc.Close()
		return nil, nil, fmt.Errorf("decoding guest response: %w", err)
	}
	if resp.Error != nil {
		gc.Close()
		cat := errdefs.FromCode(resp.Error.Code)
		if cat == nil {
			return nil, nil, fmt.Errorf("guest: %s", resp.Error.Message)
		}
		return nil, nil, fmt.Errorf("%w: %s", cat, stripCategory(resp.Error.Message, cat))
	}
	return &resp, gc, nil
}

// Do sends a request that needs no stream and returns the response.
func (c *Client) Do(ctx context.Context, req Request) (*Response, error) {
	resp, conn, err := c.Call(ctx, req)
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
