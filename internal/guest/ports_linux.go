package guest

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/netpipe"
)

func init() {
	extraOps[guestapi.OpPortConnect] = (*server).opPortConnect
	helperOps[guestapi.OpPortConnect] = true
}

// portDialTimeout bounds a connect on the sandbox's loopback. A refusal is
// immediate; only a listener whose accept backlog is full makes it wait.
const portDialTimeout = 10 * time.Second

// opPortConnect dials the port in the sandbox's network namespace (the
// guest lives in it, so 127.0.0.1 here is the sandbox's loopback, never
// the host's) and then pipes bytes both ways.
func (s *server) opPortConnect(c *opConn, req guestapi.Request) {
	port := 0
	if req.Port != nil {
		port = req.Port.Port
	}
	tc, err := dialLoopback(port)
	if c.respond(guestapi.Response{}, err) != nil || err != nil {
		if tc != nil {
			tc.Close()
		}
		return
	}
	netpipe.Splice(c.conn, tc)
}

// dialLoopback connects to 127.0.0.1:port, or to [::1]:port when nothing
// listens on the IPv4 address (servers that bind "localhost" may take
// either).
func dialLoopback(port int) (net.Conn, error) {
	if err := guestapi.ValidPort(port); err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: portDialTimeout}
	p := strconv.Itoa(port)
	conn, err := d.Dial("tcp4", "127.0.0.1:"+p)
	if err == nil {
		return conn, nil
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return nil, fmt.Errorf("%w: connecting to port %d in the sandbox: %v", errdefs.ErrUnavailable, port, errors.Unwrap(err))
	}
	// A sandbox without IPv6 answers EADDRNOTAVAIL or ENETUNREACH here:
	// either way nothing listens.
	if conn, err := d.Dial("tcp6", "[::1]:"+p); err == nil {
		return conn, nil
	}
	return nil, fmt.Errorf("%w: nothing listens on port %d in the sandbox", errdefs.ErrNotFound, port)
}
