package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/netpipe"
)

// Bounds on host forwards, so that a flood of connections or requests
// cannot exhaust the daemon's descriptors.
const (
	// maxForwardConns is how many connections one forward carries at once;
	// one more is reset at accept.
	maxForwardConns = 1024
	// maxForwards is how many forwards one sandbox may have.
	maxForwards = 128
	// maxForwardConnsTotal is how many connections all forwards of the
	// daemon carry at once (each holds two descriptors).
	maxForwardConnsTotal = 16384
)

// portDialFunc opens a byte pipe to a port in a sandbox.
type portDialFunc func(ctx context.Context, id string, port int) (net.Conn, error)

type portKey struct {
	id   string
	port int
}

// portTable holds the host forwards. A forward is a listener on the host's
// 127.0.0.1 (never another address) for one port of one sandbox; it ends
// when the sandbox's guest exits (stop, delete, failure), when it is
// deleted, or with the daemon.
//
// Forwards are not recorded: they do not survive a daemon restart, and a
// client asks again (the same request, which is idempotent) and may get a
// new address. Their connections run through the daemon and end with it
// anyway, and the host port could not be promised back: once the
// listener is gone, any host process may take it.
type portTable struct {
	dial      portDialFunc
	done      func(ctx context.Context, id string) (<-chan struct{}, error)
	log       *slog.Logger
	maxConns  int // per forward
	maxTotal  int // over all forwards
	connCount atomic.Int64

	mu sync.Mutex
	m  map[portKey]*forward
}

func newPortTable(dial portDialFunc, done func(ctx context.Context, id string) (<-chan struct{}, error), log *slog.Logger) *portTable {
	return &portTable{dial: dial, done: done, log: log, maxConns: maxForwardConns, maxTotal: maxForwardConnsTotal, m: map[portKey]*forward{}}
}

type forward struct {
	t       *portTable
	key     portKey
	ln      net.Listener
	created time.Time
	// ctx ends pending dials when the forward closes.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// open returns the forward of a port of a running sandbox, opening it if
// there is none; created says which.
func (t *portTable) open(ctx context.Context, id string, port int) (f api.PortForward, created bool, err error) {
	if err := guestapi.ValidPort(port); err != nil {
		return api.PortForward{}, false, err
	}
	done, err := t.done(ctx, id)
	if err != nil {
		return api.PortForward{}, false, err
	}
	key := portKey{id, port}
	t.mu.Lock()
	defer t.mu.Unlock()
	if fw, ok := t.m[key]; ok {
		return fw.info(), false, nil
	}
	n := 0
	for k := range t.m {
		if k.id == id {
			n++
		}
	}
	if n >= maxForwards {
		return api.PortForward{}, false, errdefs.Conflict("sandbox %s already has %d port forwards; remove one first", id, n)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return api.PortForward{}, false, fmt.Errorf("opening a host listener: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fw := &forward{t: t, key: key, ln: ln, created: time.Now().UTC(), ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	t.m[key] = fw
	go fw.serve()
	go func() {
		select {
		case <-done:
			t.remove(fw)
			fw.close()
			t.log.Info("port forward closed: the sandbox ended", "sandbox", id, "port", port)
		case <-ctx.Done():
		}
	}()
	t.log.Info("port forward opened", "sandbox", id, "port", port, "address", ln.Addr().String())
	return fw.info(), true, nil
}

// list returns a sandbox's forwards by port.
func (t *portTable) list(id string) []api.PortForward {
	t.mu.Lock()
	var fws []*forward
	for k, fw := range t.m {
		if k.id == id {
			fws = append(fws, fw)
		}
	}
	t.mu.Unlock()
	sort.Slice(fws, func(i, j int) bool { return fws[i].key.port < fws[j].key.port })
	out := make([]api.PortForward, 0, len(fws))
	for _, fw := range fws {
		out = append(out, fw.info())
	}
	return out
}

// close closes the forward of a port and every connection it carries.
func (t *portTable) close(id string, port int) error {
	t.mu.Lock()
	fw, ok := t.m[portKey{id, port}]
	delete(t.m, portKey{id, port})
	t.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: sandbox %s has no forward of port %d", errdefs.ErrNotFound, id, port)
	}
	fw.close()
	t.log.Info("port forward closed", "sandbox", id, "port", port)
	return nil
}

// closeAll closes every forward (daemon shutdown, tests).
func (t *portTable) closeAll() {
	t.mu.Lock()
	fws := make([]*forward, 0, len(t.m))
	for k, fw := range t.m {
		fws = append(fws, fw)
		delete(t.m, k)
	}
	t.mu.Unlock()
	for _, fw := range fws {
		fw.close()
	}
}

func (t *portTable) remove(fw *forward) {
	t.mu.Lock()
	if t.m[fw.key] == fw {
		delete(t.m, fw.key)
	}
	t.mu.Unlock()
}

func (f *forward) info() api.PortForward {
	f.mu.Lock()
	defer f.mu.Unlock()
	return api.PortForward{Port: f.key.port, HostAddress: f.ln.Addr().String(), Connections: len(f.conns), CreatedAt: f.created}
}

func (f *forward) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, most likely: wait rather than spin.
			f.t.log.Warn("accepting on a port forward", "sandbox", f.key.id, "port", f.key.port, "err", err)
			select {
			case <-f.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		if !f.track(c) {
			resetConn(c)
			continue
		}
		go f.pipe(c)
	}
}

// track counts a new connection, or refuses it when the forward is full
// or closing.
func (f *forward) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	if len(f.conns) >= f.t.maxConns {
		f.t.log.Debug("port forward full; connection reset", "sandbox", f.key.id, "port", f.key.port, "limit", f.t.maxConns)
		return false
	}
	if f.t.connCount.Add(1) > int64(f.t.maxTotal) {
		f.t.connCount.Add(-1)
		f.t.log.Warn("port forwards carry the daemon's limit of connections; connection reset", "sandbox", f.key.id, "port", f.key.port, "limit", f.t.maxTotal)
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

// untrack forgets a connection that ended.
func (f *forward) untrack(c net.Conn) {
	f.mu.Lock()
	if _, ok := f.conns[c]; ok {
		delete(f.conns, c)
		f.t.connCount.Add(-1)
	}
	f.mu.Unlock()
}

// pipe connects one accepted connection to the port in the sandbox. When
// nothing listens there the connection is reset, so that the client sees
// a refusal rather than an empty answer.
func (f *forward) pipe(c net.Conn) {
	defer f.untrack(c)
	up, err := f.t.dial(f.ctx, f.key.id, f.key.port)
	if err != nil {
		f.t.log.Debug("port forward connection refused", "sandbox", f.key.id, "port", f.key.port, "err", err)
		resetConn(c)
		return
	}
	netpipe.Splice(c, up)
}

func (f *forward) close() {
	f.cancel()
	f.ln.Close()
	f.mu.Lock()
	f.closed = true
	conns := make([]net.Conn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// resetConn closes a TCP connection with a reset rather than a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}
