package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// maxIdleConns bounds the connections kept for the next request.
	maxIdleConns = 64
	// directBodyMax is the largest request body sent by the calling
	// goroutine; larger or unsized bodies (uploads) go through net/http.
	directBodyMax = 1 << 20
)

// transport is the SDK's http.RoundTripper. The calling goroutine writes
// the request and reads the answer on a kept connection: net/http's
// Transport hands each request to a writer goroutine and each answer back
// from a reader goroutine, and on a small VM those hand-offs are a
// measurable part of a short exec (0.15-0.2 ms of a round trip here).
// Uploads of unknown or large size and upgraded streams, which need the
// request written while the answer is read, go through net/http's.
type transport struct {
	dial     func(ctx context.Context) (net.Conn, error)
	fallback *http.Transport

	mu     sync.Mutex
	idle   []*streamConn
	closed bool
}

type streamConn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	large := req.Body != nil && req.Body != http.NoBody && (req.ContentLength < 0 || req.ContentLength > directBodyMax)
	if large || req.Header.Get("Upgrade") != "" {
		return t.fallback.RoundTrip(req)
	}
	return t.roundTrip(req)
}

// get returns an idle connection that is still open, or nil.
func (p *transport) get() *streamConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		sc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if sc.br.Buffered() == 0 && open(sc.Conn) {
			return sc
		}
		sc.Close()
	}
	return nil
}

func (p *transport) put(sc *streamConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= maxIdleConns {
		sc.Close()
		return
	}
	p.idle = append(p.idle, sc)
}

// close drops the idle connections; answers open now close theirs.
func (p *transport) close() {
	p.fallback.CloseIdleConnections()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, sc := range p.idle {
		sc.Close()
	}
	p.idle = nil
}

// roundTrip sends req and returns the answer; its body holds the
// connection until it is read to the end (the connection is then kept)
// or closed. A request that could not be written on a kept connection
// (the daemon closed it meanwhile) is sent once more on a new one.
func (p *transport) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	sc := p.get()
	kept := sc != nil
	for {
		if sc == nil {
			conn, err := p.dial(ctx)
			if err != nil {
				closeBody(req)
				return nil, err
			}
			sc = &streamConn{Conn: conn, br: bufio.NewReaderSize(conn, 64<<10), bw: bufio.NewWriterSize(conn, 4<<10)}
		}
		stop := context.AfterFunc(ctx, func() { sc.Close() })
		err := req.Write(sc.bw)
		if err == nil {
			err = sc.bw.Flush()
		}
		if err != nil && ctx.Err() == nil {
			// The daemon may have answered and closed before reading the
			// whole body (a 413, say): that answer is the result.
			sc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if resp, rerr := http.ReadResponse(sc.br, req); rerr == nil {
				resp.Close = true
				resp.Body = &streamBody{ReadCloser: resp.Body, sc: sc, p: p, stop: stop}
				return resp, nil
			}
		}
		if err != nil {
			stop()
			sc.Close()
			if kept && ctx.Err() == nil && req.GetBody != nil {
				if body, gerr := req.GetBody(); gerr == nil {
					again := *req
					again.Body = body
					req, sc, kept = &again, nil, false
					continue
				}
			}
			return nil, ctxErr(ctx, err)
		}
		resp, err := http.ReadResponse(sc.br, req)
		if err != nil {
			stop()
			sc.Close()
			return nil, ctxErr(ctx, err)
		}
		if resp.Body == http.NoBody {
			if stop() && !resp.Close {
				p.put(sc)
			} else {
				sc.Close()
			}
			return resp, nil
		}
		resp.Body = &streamBody{ReadCloser: resp.Body, sc: sc, p: p, stop: stop, reuse: !resp.Close}
		return resp, nil
	}
}

// closeBody closes a request's body that was not sent, as a RoundTripper
// must.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// streamBody is an answer's body on a kept connection.
type streamBody struct {
	io.ReadCloser
	sc    *streamConn
	p     *transport
	stop  func() bool
	reuse bool

	once sync.Once
	eof  atomic.Bool // read to its end (Close may come from another goroutine)
}

func (b *streamBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof.Store(true)
	}
	return n, err
}

// Close keeps the connection if the body was read to its end, and closes
// it otherwise (a stream still running is not read to its end).
func (b *streamBody) Close() error {
	b.once.Do(func() {
		cancelled := !b.stop()
		if b.eof.Load() && b.reuse && !cancelled {
			b.ReadCloser.Close()
			b.p.put(b.sc)
			return
		}
		b.sc.Close()
		b.ReadCloser.Close()
	})
	return nil
}
