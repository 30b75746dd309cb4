package router

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/netpipe"
	"github.com/paddock-dev/paddock/internal/reqcheck"
	"github.com/paddock-dev/paddock/internal/server"
	"github.com/paddock-dev/paddock/wire"
)

// lane serves an exec lane (GET /v1/lane) whose requests may name
// sandboxes of any node: each request frame goes to its sandbox's node on
// a lane of the gateway's to that node, and the answer's frames come back
// as they are (headers read to find the exec's last frame, payloads
// copied, never decoded) until its exit or error frame; then the lane
// takes the next request. A client's later execs in the same sandbox go
// on a lane bound to it (GET /v1/sandboxes/{id}/lane), which is spliced.
func (rt *Router) lane(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(strings.TrimSpace(r.Header.Get("Upgrade")), api.LaneProtocol) || !headerHas(r.Header, "Connection", "upgrade") {
		server.WriteError(w, r, rt.log, errdefs.Invalid("upgrade", "GET /v1/lane needs \"Connection: Upgrade\" and \"Upgrade: %s\"", api.LaneProtocol))
		return
	}
	down, bufrw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		rt.log.Warn("hijacking lane connection", "err", err)
		return
	}
	defer down.Close()
	down.SetDeadline(time.Time{})
	bufrw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + api.LaneProtocol + "\r\nConnection: Upgrade\r\n\r\n")
	if bufrw.Flush() != nil {
		return
	}
	// A fast stream's output frames run to hundreds of KiB: buffers that
	// hold one move it in few system calls.
	l := &gatewayLane{rt: rt, r: r, in: bufrw.Reader, out: bufio.NewWriterSize(down, laneBuffer), up: map[*conns]*upLane{}}
	defer l.release()
	for l.next() {
	}
}

// gatewayLane is one client's lane and the node lanes it has used.
type gatewayLane struct {
	rt  *Router
	r   *http.Request
	in  *bufio.Reader
	out *bufio.Writer
	up  map[*conns]*upLane
}

// next answers one request; it reports whether the lane takes another.
func (l *gatewayLane) next() bool {
	var hdr [wire.HeaderSize]byte
	if _, err := io.ReadFull(l.in, hdr[:]); err != nil {
		return false // the client closed the lane
	}
	size := binary.BigEndian.Uint32(hdr[4:])
	if wire.Type(hdr[0]) != wire.Request || size > reqcheck.MaxBody {
		l.fail(errdefs.Invalid("frame", "a lane takes request frames (type %d) of at most %d bytes, not type %d of %d", wire.Request, reqcheck.MaxBody, hdr[0], size))
		return false // out of step: the client is confused or hostile
	}
	frame := make([]byte, wire.HeaderSize+int(size))
	copy(frame, hdr[:])
	if _, err := io.ReadFull(l.in, frame[wire.HeaderSize:]); err != nil {
		return false
	}
	req, err := reqcheck.LaneRequest(frame[wire.HeaderSize:], "")
	if err != nil {
		return l.fail(err)
	}
	n, err := l.rt.owner(req.Sandbox, req.Sandbox)
	if err != nil && l.rt.cfg.Archive != nil {
		n, err = l.rt.archivedOwner(context.Background(), req.Sandbox, err)
	}
	if err != nil {
		return l.fail(err)
	}
	up, err := l.send(n, frame)
	if err != nil {
		return l.fail(err)
	}
	return l.relay(n, up)
}

// send writes a request frame on a lane to node n: the one this lane
// used before, or an idle one of the gateway's, or a new one. A kept lane
// the node closed meanwhile takes no bytes; the request then goes on a
// new one.
func (l *gatewayLane) send(n *node, frame []byte) (*upLane, error) {
	up := l.up[n.conns]
	delete(l.up, n.conns)
	if up != nil && (up.br.Buffered() > 0 || !netpipe.Alive(up.conn)) {
		up.conn.Close()
		up = nil
	}
	if up == nil {
		up = n.lanes.get()
	}
	for {
		fresh := up == nil
		if fresh {
			var err error
			if up, err = n.dialLane(l.r.Context()); err != nil {
				return nil, n.unreachable(err)
			}
		}
		_, err := up.bw.Write(frame)
		if err == nil {
			err = up.bw.Flush()
		}
		if err == nil {
			return up, nil
		}
		up.conn.Close()
		if fresh {
			return nil, n.unreachable(err)
		}
		up = nil
	}
}

// relay copies one exec's answer from the node's lane to the client's:
// frame headers are read to find its last frame (exit or error), the
// payloads copied as they are. Output is flushed whenever the node has
// sent nothing more yet.
func (l *gatewayLane) relay(n *node, up *upLane) bool {
	var hdr [wire.HeaderSize]byte
	for {
		if _, err := io.ReadFull(up.br, hdr[:]); err != nil {
			// The node's lane broke off mid-answer (the node died): so
			// does the client's, as a direct lane would.
			up.conn.Close()
			n.log.Debug("node lane broke off", "err", err)
			return false
		}
		size := binary.BigEndian.Uint32(hdr[4:])
		if size > wire.MaxPayload {
			up.conn.Close()
			n.log.Warn("node lane sent an oversized frame", "bytes", size)
			return false
		}
		l.out.Write(hdr[:])
		if _, err := io.CopyN(l.out, up.br, int64(size)); err != nil {
			up.conn.Close()
			return false
		}
		last := wire.Type(hdr[0]) == wire.Exit || wire.Type(hdr[0]) == wire.Error
		if last || up.br.Buffered() == 0 {
			if l.out.Flush() != nil {
				up.conn.Close() // mid-answer: the node's lane is out of step
				return false
			}
		}
		if last {
			l.up[n.conns] = up
			return true
		}
	}
}

// fail answers a request with an error frame; it reports whether the
// lane takes another request.
func (l *gatewayLane) fail(err error) bool {
	out := wire.NewWriter(l.out)
	return out.WriteJSON(wire.Error, server.ErrorFrame(l.r, l.rt.log, err)) == nil && l.out.Flush() == nil
}

// release gives the node lanes back to their pools, each at a request's
// boundary.
func (l *gatewayLane) release() {
	for c, up := range l.up {
		c.lanes.put(up)
	}
}

// upLane is a lane from the gateway to a node.
type upLane struct {
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
}

// dialLane opens a lane to the node (GET /v1/lane).
func (c *conns) dialLane(ctx context.Context) (*upLane, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base.String()+"/v1/lane", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.LaneProtocol)
	conn, br, resp, err := c.open(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Body.Close()
		conn.Close()
		return nil, fmt.Errorf("opening an exec lane: status %d", resp.StatusCode)
	}
	return &upLane{conn: conn, br: bufio.NewReaderSize(netpipe.WithBuffered(conn, br), laneBuffer), bw: bufio.NewWriterSize(conn, 4<<10)}, nil
}

// laneBuffer sizes the buffers of a lane's answers.
const laneBuffer = 256 << 10

// maxIdleLanes bounds the idle lanes the gateway keeps to one node.
const maxIdleLanes = 64

// lanePool keeps idle lanes to one node.
type lanePool struct {
	mu     sync.Mutex
	idle   []*upLane
	closed bool
}

// get takes an idle lane that is still open (a node that restarted
// closed its old ones), or nil.
func (p *lanePool) get() *upLane {
	for {
		p.mu.Lock()
		if len(p.idle) == 0 {
			p.mu.Unlock()
			return nil
		}
		up := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		p.mu.Unlock()
		if up.br.Buffered() == 0 && netpipe.Alive(up.conn) {
			return up
		}
		up.conn.Close()
	}
}

func (p *lanePool) put(up *upLane) {
	p.mu.Lock()
	if !p.closed && len(p.idle) < maxIdleLanes {
		p.idle = append(p.idle, up)
		up = nil
	}
	p.mu.Unlock()
	if up != nil {
		up.conn.Close()
	}
}

func (p *lanePool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle, p.closed = nil, true
	p.mu.Unlock()
	for _, up := range idle {
		up.conn.Close()
	}
}
