package guest

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/reaper"
	"github.com/paddock-dev/paddock/wire"
)

// serve is the guest's steady state: it reaps every process, forwards
// signals, and serves the daemon's requests on the control socket, forking
// each command on the spawner thread.
func serve(cfg guestapi.ServeConfig, sp *spawner, sigs signals, syncSock *os.File, oom *os.File, ctl *control) error {
	s := newServer(cfg, oom, sp, serveLog())
	s.start(ctl, sigs)
	guestapi.SendReady(syncSock, guestapi.Ready{Phase: guestapi.PhaseReady, PID: os.Getpid()})
	syncSock.Close()
	return s.accept()
}

func serveLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, nil)).With("guest", os.Getpid())
}

// start has s serve on ctl: it reaps, forwards signals and binds the
// control socket again when told to.
func (s *server) start(ctl *control, sigs signals) {
	s.ctl = ctl
	s.hostname, _ = os.Hostname()
	go ctl.relistenOn(sigs.relisten, s)
	// What no pidfd watch reaps: processes reparented to us as PID 1, and
	// any of ours whose pidfd could not be watched.
	go reaper.Run(sigs.chld, s.exited)
	go s.forwardSignals(sigs.fwd)
}

// accept serves the control socket's connections until it is closed.
func (s *server) accept() error {
	ctl := s.ctl
	for {
		conn, err := ctl.listener().Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				if ctl.quiesced() {
					continue // until bound again
				}
				return nil
			}
			s.log.Warn("accepting", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !ctl.add(conn) {
			conn.Close()
			continue
		}
		go func() {
			s.handle(conn)
			ctl.remove(conn)
		}()
	}
}

type server struct {
	cfg guestapi.ServeConfig
	// oom is the cgroup's OOM counter file; nil after a quiesce (a file
	// of the host's cannot be saved in a checkpoint).
	oom atomic.Pointer[os.File]
	sp  *spawner
	log *slog.Logger

	// mu guards procs and is held across fork so that the reaper cannot
	// reap a child before it is in the table.
	mu    sync.Mutex
	procs map[int]*process
	// finished lists retained finished processes, oldest first.
	finished []int
	// oomSeen is the cgroup's OOM kill count when last read.
	oomSeen uint64

	// spare is the next process's stdout and stderr, made ahead
	// (refillOutPipes); spareMu guards it.
	spareMu sync.Mutex
	spare   *outPipes

	// lanes counts the exec lanes being served (lane_linux.go).
	lanes atomic.Int64

	// ctl is the control socket (nil in tests that serve connections
	// themselves).
	ctl *control
	// setEnv is cfg.Env once OpSetEnv changed it.
	setEnv atomic.Pointer[[]string]
	// hostname is the sandbox's when the guest began serving, or was
	// last restored (followHostname; only its goroutine writes it then).
	hostname string
}

func newServer(cfg guestapi.ServeConfig, oom *os.File, sp *spawner, log *slog.Logger) *server {
	if cfg.OutputLimit <= 0 {
		cfg.OutputLimit = 16 << 20
	}
	if cfg.Retain <= 0 {
		cfg.Retain = 256
	}
	s := &server{cfg: cfg, sp: sp, log: log, procs: map[int]*process{}}
	if oom != nil {
		s.oom.Store(oom)
	}
	s.oomSeen = s.oomKills()
	return s
}

// handle serves a connection's requests: one, or more when the client
// releases a finished process stream (wire.Release) and sends the next
// request on the same connection.
func (s *server) handle(conn net.Conn) {
	defer conn.Close()
	wire.SetSendBuffer(conn) // output streams through it
	s.serveConn(newOpConn(conn), nil)
}

// serveConn serves c's requests, the first of them first if it was read
// already (a connection the fast guest handed over).
func (s *server) serveConn(c *opConn, first []byte) {
	for {
		c.reuse = false
		payload := first
		first = nil
		if payload == nil {
			f, err := c.fr.Read()
			if err != nil {
				return
			}
			if f.Type != wire.Request {
				c.respond(guestapi.Response{}, errdefs.Invalid("frame", "expected a request frame"))
				return
			}
			payload = f.Payload
		}
		var req guestapi.Request
		if err := json.Unmarshal(payload, &req); err != nil {
			c.respond(guestapi.Response{}, errdefs.Invalid("request", "%v", err))
			return
		}
		h, ok := s.handler(req.Op)
		if !ok {
			c.respond(guestapi.Response{}, errdefs.Invalid("op", "unknown op %q", req.Op))
			return
		}
		h(s, c, req)
		if !c.reuse {
			return
		}
	}
}

// handler returns op's handler. A server without a spawner (the fast
// guest's helper) serves helperOps alone.
func (s *server) handler(op string) (opHandler, bool) {
	if s.sp == nil && !helperOps[op] {
		return nil, false
	}
	if h, ok := processOps[op]; ok {
		return h, true
	}
	h, ok := extraOps[op]
	return h, ok
}

func newOpConn(conn net.Conn) *opConn {
	return &opConn{conn: conn, fr: wire.NewReader(conn), fw: wire.NewWriter(conn)}
}

// opConn is a guest connection as an op handler sees it: the request has
// been read; the handler writes one Response frame and then, for streaming
// ops, frames both ways until it is done. The connection is closed after
// the handler returns, unless the handler set reuse: a process stream the
// client released after its exit frame.
type opConn struct {
	conn  net.Conn
	fr    *wire.Reader
	fw    *wire.Writer
	reuse bool
}

// awaitRelease reads the client's frames after a stream's exit frame
// until it releases the connection (reuse) or closes it.
func (c *opConn) awaitRelease() {
	for {
		f, err := c.fr.Read()
		if err != nil {
			return
		}
		if f.Type == wire.Release {
			c.reuse = true
			return
		}
	}
}

// respond writes the Response frame: err as an error answer, or resp.
func (c *opConn) respond(resp guestapi.Response, err error) error {
	if err != nil {
		resp = guestapi.Response{Error: apiError(err)}
	}
	return c.fw.WriteJSON(wire.Response, resp)
}

// opHandler serves one op.
type opHandler func(s *server, c *opConn, req guestapi.Request)

// extraOps are the ops beyond processes: files (files_linux.go) and ports
// (ports_linux.go) add theirs here in init functions.
var extraOps = map[string]opHandler{}

// helperOps are the extraOps that need nothing of PID 1 (no process, no
// listener, no environment): the fast guest passes them on to its helper
// (Helper) instead of handing the sandbox over.
var helperOps = map[string]bool{}

func apiError(err error) *api.Error {
	if err == nil {
		return nil
	}
	return &api.Error{Code: errdefs.Code(err), Message: err.Error()}
}
