package guestapi

import (
	"context"
	"net"

	"github.com/paddock-dev/paddock/internal/netpipe"
)

// DialPort opens a byte pipe to a TCP port on the sandbox's loopback
// (127.0.0.1, or ::1 when nothing listens there). ctx bounds the connect,
// not the connection. A port nothing listens on is an errdefs.ErrNotFound.
//
// The returned conn is the control connection itself, so CloseWrite
// half-closes all the way to the sandbox's TCP peer.
func (c *Client) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if err := ValidPort(port); err != nil {
		return nil, err
	}
	_, gc, err := c.request(ctx, Request{Op: OpPortConnect, Port: &PortRequest{Port: port}})
	if err != nil {
		return nil, err
	}
	return gc.raw(), nil
}

// raw ends the framed part of a connection and returns the bare
// connection. The frame reader reads ahead through a buffer, which may
// already hold the first bytes of the pipe (a server that speaks first, a
// fast answer): those are handed out before anything else is read. The
// buffer goes back to the pool now, while no read can be using it; later
// reads bypass it.
func (c *Conn) raw() net.Conn {
	conn := netpipe.WithBuffered(c.Conn, c.br)
	c.once.Do(func() {
		c.br.Reset(nil)
		readers.Put(c.br)
	})
	return conn
}
