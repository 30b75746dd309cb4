package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"paddock/api"
	"paddock/wire"
)

// errNoLanes: the daemon does not serve exec lanes (an older one).
var errNoLanes = errors.New("the daemon has no exec lanes")

// lane is a connection upgraded to an exec lane (GET /v1/lane): it
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

// lanes pools a client's idle exec lanes.
type lanes struct {
	none atomic.Bool // the daemon answered that it has none
	connPool
}

// dialLane opens a new lane.
func (c *Client) dialLane(ctx context.Context) (*lane, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	l := newLane(newKeptConn(conn))
	req, _ := http.NewRequest(http.MethodGet, c.base+"/v1/lane", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", api.LaneProtocol)
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	err = req.Write(l.bw)
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
		conn.Close()
		return nil, ctx.Err()
	case err != nil:
		conn.Close()
		return nil, fmt.Errorf("%w: opening an exec lane: %v", ErrUnavailable, err)
	case resp.StatusCode == http.StatusSwitchingProtocols:
		return l, nil
	}
	if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
		// A whole answer on a kept-alive connection: the HTTP way, which
		// the caller takes now, can have it.
		_, err := io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if err == nil && !resp.Close && resp.Body.Close() == nil {
			c.tr.put(l.keptConn)
		} else {
			conn.Close()
		}
		return nil, errNoLanes
	}
	defer conn.Close()
	return nil, readError(resp)
}

// execLane runs an exec without input or terminal on a lane. ok is false
// when the daemon has no lanes: the caller then takes the HTTP way.
func (c *Client) execLane(ctx context.Context, id string, req api.ExecRequest, eio ExecIO) (_ *api.ExitStatus, ok bool, _ error) {
	if c.lanes.none.Load() {
		return nil, false, nil
	}
	payload, err := json.Marshal(api.LaneRequest{Sandbox: id, Exec: req})
	if err != nil {
		return nil, true, err
	}
	var l *lane
	if kc := c.lanes.get(); kc != nil {
		l = newLane(kc)
	}
	kept := l != nil
	for {
		if l == nil {
			if l, err = c.dialLane(ctx); err != nil {
				if errors.Is(err, errNoLanes) {
					c.lanes.none.Store(true)
					return nil, false, nil
				}
				return nil, true, err
			}
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
			return nil, true, ctxErr(ctx, fmt.Errorf("%w: %v", ErrUnavailable, err))
		}
		// Not written: the daemon closed the kept lane meanwhile. Once
		// more, on a new one.
		l, kept = nil, false
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	st, reusable, err := c.laneAnswer(l, eio)
	if !stop() {
		l.Close()
		return nil, true, ctx.Err()
	}
	if reusable {
		c.lanes.put(l.keptConn)
	} else {
		l.Close()
	}
	return st, true, err
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
	return st, err == nil, err
}
