// Package connlimit keeps an HTTP server on a TCP listener answering
// while peers that hold no credentials open connections and keep them:
// it bounds the connections a listener holds, and the share of them that
// have not authenticated, overall and per peer address. A connection is
// unauthenticated from its accept until a handler calls Authenticated;
// while it is, it may be closed to make room for a newer one (the oldest
// first), its request must arrive within the server's ReadTimeout, and
// it is closed after its first response (a 401, or a public answer).
// Authenticated connections are bounded only by the listener's total,
// and have no read deadline while a request streams (exec output, logs
// --follow, uploads); idle between requests, the server's IdleTimeout
// ends them.
//
// The unix socket is not wrapped: it has no unauthenticated peers.
package connlimit

import (
	"container/list"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Limits bounds one listener's connections. A zero field takes its
// default.
type Limits struct {
	// Conns is how many connections the listener holds at once; a new
	// one beyond it closes the oldest unauthenticated one, or is itself
	// closed when every held connection is authenticated. Default 4096.
	Conns int
	// Unauthenticated is how many of them may be unauthenticated; a new
	// one beyond it closes the oldest. Default 1024.
	Unauthenticated int
	// PerPeer is how many unauthenticated connections one peer address
	// may hold; a new one beyond it closes that peer's oldest, so that a
	// flooding peer pushes out its own connections before anyone else's.
	// Default 64.
	PerPeer int
}

func (l Limits) withDefaults() Limits {
	if l.Conns <= 0 {
		l.Conns = 4096
	}
	if l.Unauthenticated <= 0 {
		l.Unauthenticated = 1024
	}
	if l.PerPeer <= 0 {
		l.PerPeer = 64
	}
	return l
}

// Listener is a net.Listener that keeps to its Limits.
type Listener struct {
	net.Listener
	lim Limits
	log *slog.Logger

	mu      sync.Mutex
	total   int
	unauth  list.List // of *Conn, oldest first
	perPeer map[netip.Addr]*list.List
	shed    int // connections closed to keep the limits since the last log line
	lastLog time.Time
}

// New wraps l.
func New(l net.Listener, lim Limits, log *slog.Logger) *Listener {
	return &Listener{Listener: l, lim: lim.withDefaults(), log: log, perPeer: map[netip.Addr]*list.List{}}
}

// Accept returns the next connection, closing older unauthenticated
// ones (or this one) to stay within the limits.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c := l.admit(nc); c != nil {
			return c, nil
		}
	}
}

// admit accounts nc as an unauthenticated connection, or closes it when
// the listener is full of authenticated ones.
func (l *Listener) admit(nc net.Conn) *Conn {
	peer := peerAddr(nc)
	var victims []*Conn
	l.mu.Lock()
	if pl := l.perPeer[peer]; pl != nil && pl.Len() >= l.lim.PerPeer {
		victims = append(victims, l.dropLocked(pl.Front().Value.(*Conn)))
	}
	if l.unauth.Len() >= l.lim.Unauthenticated {
		victims = append(victims, l.dropLocked(l.unauth.Front().Value.(*Conn)))
	}
	if l.total >= l.lim.Conns && l.unauth.Len() > 0 {
		victims = append(victims, l.dropLocked(l.unauth.Front().Value.(*Conn)))
	}
	var c *Conn
	if l.total < l.lim.Conns {
		c = &Conn{Conn: nc, l: l, peer: peer}
		l.total++
		c.elem = l.unauth.PushBack(c)
		pl := l.perPeer[peer]
		if pl == nil {
			pl = list.New()
			l.perPeer[peer] = pl
		}
		c.peerElem = pl.PushBack(c)
	} else {
		l.shed++
	}
	l.shed += len(victims)
	logNow := l.shed > 0 && time.Since(l.lastLog) > 10*time.Second
	shed := l.shed
	if logNow {
		l.lastLog, l.shed = time.Now(), 0
	}
	l.mu.Unlock()
	for _, v := range victims {
		v.Conn.Close()
	}
	if c == nil {
		nc.Close()
	}
	if logNow && l.log != nil {
		l.log.Warn("closed connections to stay within the listener's limits",
			"addr", l.Addr().String(), "closed", shed, "max_conns", l.lim.Conns,
			"max_unauthenticated", l.lim.Unauthenticated, "max_per_peer", l.lim.PerPeer)
	}
	return c
}

// dropLocked removes an unauthenticated c from every count; l.mu is held.
func (l *Listener) dropLocked(c *Conn) *Conn {
	l.forgetLocked(c)
	c.dropped = true
	return c
}

// forgetLocked takes c out of the counts it is in; l.mu is held.
func (l *Listener) forgetLocked(c *Conn) {
	if c.gone {
		return
	}
	c.gone = true
	l.total--
	l.unmarkLocked(c)
}

// unmarkLocked takes c out of the unauthenticated lists; l.mu is held.
func (l *Listener) unmarkLocked(c *Conn) {
	if c.elem == nil {
		return
	}
	l.unauth.Remove(c.elem)
	c.elem = nil
	if pl := l.perPeer[c.peer]; pl != nil {
		pl.Remove(c.peerElem)
		if pl.Len() == 0 {
			delete(l.perPeer, c.peer)
		}
	}
	c.peerElem = nil
}

// Counts reports the connections held and how many are unauthenticated.
func (l *Listener) Counts() (total, unauthenticated int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.unauth.Len()
}

// ConnState is the http.Server hook that closes an unauthenticated
// connection once its first response is written.
func (l *Listener) ConnState(nc net.Conn, st http.ConnState) {
	c, ok := connOf(nc)
	if !ok || st != http.StateIdle {
		return
	}
	l.mu.Lock()
	if c.elem != nil {
		c.answered = true
	}
	l.mu.Unlock()
}

// ConnContext is the http.Server hook that lets handlers find their
// connection (see Authenticated).
func ConnContext(ctx context.Context, nc net.Conn) context.Context {
	if c, ok := connOf(nc); ok {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

type connKey struct{}

// connOf is the Conn under nc, which may be a TLS connection over it (a
// cluster node's listener).
func connOf(nc net.Conn) (*Conn, bool) {
	if tc, ok := nc.(interface{ NetConn() net.Conn }); ok {
		nc = tc.NetConn()
	}
	c, ok := nc.(*Conn)
	return c, ok
}

// Handler wraps a server's handler so that a response on a connection
// still unauthenticated says "Connection: close" (Authenticated takes it
// back). The listener ends such a connection after its response
// (ConnState); a client not told so may send its next request on it as
// it closes and lose that request: an E2B SDK did, asking whether a
// sandbox it had just killed was running, on the connection of the
// refused call before.
func Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, ok := r.Context().Value(connKey{}).(*Conn); ok && c.unauthenticated() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// unauthenticated reports whether c has not authenticated.
func (c *Conn) unauthenticated() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	return c.elem != nil
}

// Authenticated marks the connection of r as authenticated (it leaves the
// unauthenticated counts and stays open after its response, whose
// "Connection: close" from Handler it takes back) and lifts the
// request's read deadline, so that a long upload or stream is not cut at
// the server's ReadTimeout. A handler calls it once r's credentials are
// checked, before its response is written. It does nothing for a
// connection not from a Listener.
func Authenticated(w http.ResponseWriter, r *http.Request) {
	c, ok := r.Context().Value(connKey{}).(*Conn)
	if !ok {
		return
	}
	c.l.mu.Lock()
	was := c.elem != nil
	c.l.unmarkLocked(c)
	c.l.mu.Unlock()
	if was && w.Header().Get("Connection") == "close" {
		w.Header().Del("Connection")
	}
	http.NewResponseController(w).SetReadDeadline(time.Time{})
}

// Conn is a connection accepted by a Listener.
type Conn struct {
	net.Conn
	l    *Listener
	peer netip.Addr
	// Guarded by l.mu:
	elem, peerElem *list.Element // in the unauthenticated lists; nil once authenticated
	answered       bool          // unauthenticated and answered: no next request
	gone           bool          // out of every count
	dropped        bool          // closed to make room
}

// SetReadDeadline keeps the server's deadlines, except that an
// unauthenticated connection that was answered gets none: its wait for a
// next request ends at once, and the server closes it.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.l.mu.Lock()
	answered := c.answered && c.elem != nil
	c.l.mu.Unlock()
	if answered {
		t = time.Unix(1, 0)
	}
	return c.Conn.SetReadDeadline(t)
}

// Close closes the connection and frees its place.
func (c *Conn) Close() error {
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// CloseWrite half-closes the connection when the underlying one can
// (port forwards and exec streams rely on it).
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return &net.OpError{Op: "close", Net: c.LocalAddr().Network(), Err: net.ErrClosed}
}

// ReadFrom and WriteTo keep the underlying connection's fast paths
// (splice, sendfile) for copies through the wrapper.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }

// WriteTo copies the connection's input to w.
func (c *Conn) WriteTo(w io.Writer) (int64, error) { return io.Copy(w, c.Conn) }

func peerAddr(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}
