package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/wire"
)

// errNoLanes: the daemon does not serve exec lanes of the kind asked for
// (an older one), or not for this sandbox id.
var errNoLanes = errors.New("the daemon has no exec lanes")

// errNoSandbox: no lane bound to the sandbox: no such sandbox.
var errNoSandbox = errors.New("no such sandbox")

// errNoIdleLane: no idle lane, and none to be dialled.
var errNoIdleLane = errors.New("no idle exec lane")

// errLaneBroke: a lane broke off in the middle of an exec's stream.
var errLaneBroke = fmt.Errorf("%w: the exec lane broke off", ErrUnavailable)

// lane is a connection upgraded to an exec lane (GET /v1/lane, or GET
// /v1/sandboxes/{id}/lane for one bound to a sandbox): it
// carries one exec after another as frames, without an HTTP request and
// answer for each, which on a small VM saves about 0.1 ms of a short exec's
// round trip (the parsing, and net/http's goroutine hand-offs and
// thread wakes, on both sides).
type lane struct {
	*keptConn
	fr *wire.Reader
	fw *wire.Writer
}

func newLane(kc *keptConn) *lane {
	return &lane{keptConn: kc, fr: wire.NewReader(kc.br), fw: wire.NewWriter(kc.bw)}
}

// lanes pools a client's idle exec lanes: those bound to a sandbox (GET
// /v1/sandboxes/{id}/lane, served by the sandbox's guest on a local
// socket) by its id, and the daemon's (GET /v1/lane) under "".
type lanes struct {
	none    atomic.Bool // the daemon answered that it has none
	noBound atomic.Bool // it has none bound to a sandbox

	mu      sync.Mutex
	pools   map[string]*connPool
	opening map[string]bool // sandboxes a lane is being opened for
	// once are the sandboxes that have had one exec on the daemon's lane
	// and no bound lane opened yet (wantBound).
	once   map[string]bool
	closed bool
}

// maxOnce bounds lanes.once: past it, it is emptied, and those sandboxes'
// bound lanes open one exec later.
const maxOnce = 1024

// wantBound reports whether a lane bound to sandbox id is worth opening
// after an exec on the daemon's lane: from its second such exec on. A
// sandbox that runs one command (create, exec, delete: a churn loop, a
// burst of creates) would not use it, and opening it costs the daemon an
// upgrade and a hand-off to the guest, and the guest a lane, for nothing
// (issue 21: 50 of them competed with a burst's first commands).
func (ls *lanes) wantBound(id string) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.once[id] {
		delete(ls.once, id)
		return true
	}
	if ls.once == nil || len(ls.once) >= maxOnce {
		ls.once = map[string]bool{}
	}
	ls.once[id] = true
	return false
}

// startOpening claims the opening of a lane bound to sandbox id.
func (ls *lanes) startOpening(id string) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed || ls.opening[id] {
		return false
	}
	if ls.opening == nil {
		ls.opening = map[string]bool{}
	}
	ls.opening[id] = true
	return true
}

func (ls *lanes) doneOpening(id string) {
	ls.mu.Lock()
	delete(ls.opening, id)
	ls.mu.Unlock()
}

// maxLanePools bounds the sandboxes whose lanes a client keeps.
const maxLanePools = 64

// pool returns the idle lanes of key, made on first use.
func (ls *lanes) pool(key string) *connPool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.closed {
		return &connPool{closed: true} // what is put in it is closed
	}
	if p := ls.pools[key]; p != nil {
		return p
	}
	if ls.pools == nil {
		ls.pools = map[string]*connPool{}
	}
	if len(ls.pools) >= maxLanePools {
		for k, p := range ls.pools {
			if k != "" {
				p.closeIdle()
				delete(ls.pools, k)
				break
			}
		}
	}
	p := &connPool{}
	ls.pools[key] = p
	return p
}

// drop closes the idle lanes bound to sandbox id (deleted, frozen, paused
// or stopped).
func (ls *lanes) drop(id string) {
	ls.mu.Lock()
	p := ls.pools[id]
	delete(ls.pools, id)
	delete(ls.once, id)
	ls.mu.Unlock()
	if p != nil {
		p.closeIdle()
	}
}

// closeIdle drops every idle lane.
func (ls *lanes) closeIdle() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, p := range ls.pools {
		p.closeIdle()
	}
	ls.pools, ls.once = nil, nil
	ls.closed = true
}

// dialLane opens a new lane: bound to sandbox id, or the daemon's when id
// is "".
func (c *Client) dialLane(ctx context.Context, id string) (*lane, error) {
	path := "/v1/lane"
	if id != "" {
		path = "/v1/sandboxes/" + url.PathEscape(id) + "/lane"
	}
	req, _ := http.NewRequest(http.MethodGet, c.base+path, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.LaneProtocol)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	// An idle HTTP connection is upgraded if there is one (the answer
	// of a daemon without lanes left it there); if the daemon closed it
	// meanwhile, a new one.
	kc := c.tr.get()
	kept := kc != nil
	for {
		if kc == nil {
			conn, err := c.dial(ctx)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
			}
			kc = newKeptConn(conn)
		}
		l, resp, err := c.upgradeLane(ctx, kc, req)
		switch {
		case err == nil && resp == nil:
			return l, nil
		case err == nil:
			return nil, c.noLane(kc, resp)
		case kept && ctx.Err() == nil:
			kc, kept = nil, false
		default:
			return nil, err
		}
	}
}

// upgradeLane sends the upgrade request on kc: a lane, or the answer
// that refused it, or an error (kc closed).
func (c *Client) upgradeLane(ctx context.Context, kc *keptConn, req *http.Request) (*lane, *http.Response, error) {
	stop := context.AfterFunc(ctx, func() { kc.Close() })
	l := newLane(kc)
	err := req.Write(l.bw)
	if err == nil {
		err = l.bw.Flush()
	}
	var resp *http.Response
	if err == nil {
		resp, err = http.ReadResponse(l.br, req)
	}
	cancelled := !stop()
	switch {
	case cancelled:
		kc.Close()
		return nil, nil, ctx.Err()
	case err != nil:
		kc.Close()
		return nil, nil, fmt.Errorf("%w: opening an exec lane: %v", ErrUnavailable, err)
	case resp.StatusCode == http.StatusSwitchingProtocols:
		return l, nil, nil
	}
	return nil, resp, nil
}

// noLane is the error of an upgrade to a lane that the daemon refused
// with resp on kc.
func (c *Client) noLane(kc *keptConn, resp *http.Response) error {
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		// No such lanes (an older daemon: not an API error's JSON), or
		// no such sandbox, which the daemon's lane or the HTTP way, taken
		// now, reports. A whole answer on a kept-alive connection: that
		// way can have it.
		noLanes := errNoLanes
		if resp.Header.Get("Content-Type") == "application/json" {
			noLanes = errNoSandbox
		}
		_, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if err == nil && !resp.Close && resp.Body.Close() == nil {
			c.tr.put(kc)
		} else {
			kc.Close()
		}
		return noLanes
	}
	defer kc.Close()
	return readError(resp)
}

// execLane runs an exec without input or terminal on a lane: an idle one
// bound to the sandbox, or else the daemon's (and, from the sandbox's
// second exec on, a bound one is opened for the next once this one is
// done: opening it, the daemon hands it to the guest, costs more than
// one exec gains from it; wantBound). ok is
// false when the daemon has no lanes: the caller then takes the HTTP way.
func (c *Client) execLane(ctx context.Context, id string, req api.ExecRequest, eio ExecIO) (_ *api.ExitStatus, ok bool, _ error) {
	if c.lanes.none.Load() {
		return nil, false, nil
	}
	payload, err := json.Marshal(api.LaneRequest{Sandbox: id, Exec: req})
	if err != nil {
		return nil, true, err
	}
	bound := api.IsSandboxID(id) && !c.lanes.noBound.Load()
	if bound {
		st, err := c.laneExec(ctx, id, payload, eio, false)
		if !errors.Is(err, errNoIdleLane) {
			return st, true, err
		}
		if c.lanes.wantBound(id) {
			defer c.openLaneAhead(id)
		}
	}
	st, err := c.laneExec(ctx, "", payload, eio, true)
	if errors.Is(err, errNoLanes) {
		c.lanes.none.Store(true)
		return nil, false, nil
	}
	return st, true, err
}

// openLaneAhead opens a lane bound to sandbox id for its next exec, on a
// goroutine, one at a time per sandbox.
func (c *Client) openLaneAhead(id string) {
	if c.lanes.none.Load() || !c.lanes.startOpening(id) {
		return
	}
	go func() {
		defer c.lanes.doneOpening(id)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l, err := c.dialLane(ctx, id)
		switch {
		case err == nil:
			c.lanes.pool(id).put(l.keptConn)
		case errors.Is(err, errNoLanes):
			c.lanes.noBound.Store(true)
		}
	}()
}

// laneExec sends an exec request on a lane of key (a sandbox's id, or ""
// for the daemon's) and reads its answer: on an idle lane, or, with dial
// set, a new one; errNoIdleLane if there is none and dial is unset.
func (c *Client) laneExec(ctx context.Context, key string, payload []byte, eio ExecIO, dial bool) (*api.ExitStatus, error) {
	pool := c.lanes.pool(key)
	var l *lane
	for {
		kept := false
		var err error
		if kc := pool.get(); kc != nil {
			l, kept = newLane(kc), true
		} else if !dial {
			return nil, errNoIdleLane
		} else if l, err = c.dialLane(ctx, key); err != nil {
			return nil, err
		}
		err = l.fw.Write(wire.Request, payload)
		if err == nil {
			err = l.bw.Flush()
		}
		if err == nil {
			break
		}
		l.Close()
		if !kept || ctx.Err() != nil {
			return nil, ctxErr(ctx, fmt.Errorf("%w: %v", ErrUnavailable, err))
		}
		// Not written: the lane was closed meanwhile (by the daemon, or by
		// the guest serving it). Once more, on another.
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	st, reusable, err := c.laneAnswer(l, eio)
	if !stop() {
		l.Close()
		return nil, ctx.Err()
	}
	if reusable {
		pool.put(l.keptConn)
	} else {
		l.Close()
	}
	if err != nil && key != "" && errors.Is(err, errLaneBroke) && c.ended(ctx, key) {
		// A lane the sandbox's guest served ends with it.
		return &api.ExitStatus{ExitCode: -1, Error: "sandbox ended"}, nil
	}
	return st, err
}

// ended reports whether sandbox id is gone or no longer running, asking
// for up to two seconds: a lane its guest served breaks off as the guest
// dies, a moment before the daemon's record says so.
func (c *Client) ended(ctx context.Context, id string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	for {
		sb, err := c.Get(ctx, id)
		if IsNotFound(err) || (err == nil && sb.State != api.StateRunning) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// laneAnswer reads one exec's answer from a lane: an error frame, or a
// started frame and the process's stream. reusable says the lane is at a
// request's boundary.
func (c *Client) laneAnswer(l *lane, eio ExecIO) (_ *api.ExitStatus, reusable bool, _ error) {
	f, err := l.fr.Read()
	if err != nil {
		return nil, false, fmt.Errorf("%w: reading the exec lane: %v", ErrUnavailable, err)
	}
	switch f.Type {
	case wire.Error:
		var e api.Error
		json.Unmarshal(f.Payload, &e)
		return nil, true, &Error{Status: e.Status, Code: e.Code, Message: e.Message}
	case wire.Started:
	default:
		return nil, false, fmt.Errorf("exec lane: frame type %d where a start or an error was due", f.Type)
	}
	var started struct {
		PID int `json:"pid"`
	}
	json.Unmarshal(f.Payload, &started)
	if eio.OnStart != nil {
		eio.OnStart(started.PID)
	}
	s := &ExecStream{PID: started.PID, body: l.keptConn, fr: l.fr, lane: true}
	st, err := s.Wait(eio.Stdout, eio.Stderr)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		err = fmt.Errorf("%w: %w", errLaneBroke, err)
	}
	return st, err == nil, err
}
