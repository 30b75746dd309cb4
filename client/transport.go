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

	"github.com/paddock-dev/paddock/internal/netpipe"
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
	connPool
}

// keptConn is a connection to the daemon with its buffers.
type keptConn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

func newKeptConn(conn net.Conn) *keptConn {
	return &keptConn{Conn: conn, br: bufio.NewReaderSize(conn, 64<<10), bw: bufio.NewWriterSize(conn, 4<<10)}
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	large := req.Body != nil && req.Body != http.NoBody && (req.ContentLength < 0 || req.ContentLength > directBodyMax)
	if large || req.Header.Get("Upgrade") != "" {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	if kc := t.get(); kc != nil {
		resp, written, err := t.send(req, kc)
		if written || ctx.Err() != nil || req.GetBody == nil {
			return resp, err
		}
		// Not written: the daemon closed the kept connection meanwhile.
		// Once more, on a new one.
		body, gerr := req.GetBody()
		if gerr != nil {
			return nil, err
		}
		again := *req
		again.Body = body
		req = &again
	}
	conn, err := t.dial(ctx)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	resp, _, err := t.send(req, newKeptConn(conn))
	return resp, err
}

// send writes req on kc and reads the answer, whose body holds kc until
// it is read to the end (kc is then kept) or closed. written says the
// whole request went out.
func (t *transport) send(req *http.Request, kc *keptConn) (_ *http.Response, written bool, _ error) {
	ctx := req.Context()
	stop := context.AfterFunc(ctx, func() { kc.Close() })
	err := req.Write(kc.bw)
	if err == nil {
		err = kc.bw.Flush()
	}
	if err != nil {
		if ctx.Err() == nil {
			// The daemon may have answered and closed before reading the
			// whole body (a 413, say): that answer is the result.
			kc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if resp, rerr := http.ReadResponse(kc.br, req); rerr == nil {
				resp.Body = &keptBody{ReadCloser: resp.Body, kc: kc, t: t, stop: stop}
				return resp, true, nil
			}
		}
		stop()
		kc.Close()
		return nil, false, ctxErr(ctx, err)
	}
	resp, err := http.ReadResponse(kc.br, req)
	if err != nil {
		stop()
		kc.Close()
		return nil, true, ctxErr(ctx, err)
	}
	if resp.Body == http.NoBody {
		if stop() && !resp.Close {
			t.put(kc)
		} else {
			kc.Close()
		}
		return resp, true, nil
	}
	resp.Body = &keptBody{ReadCloser: resp.Body, kc: kc, t: t, stop: stop, reuse: !resp.Close}
	return resp, true, nil
}

// connPool keeps idle connections to the daemon for the next call.
type connPool struct {
	mu     sync.Mutex
	idle   []*keptConn
	closed bool
}

// get returns an idle connection that is still open, or nil.
func (p *connPool) get() *keptConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		kc := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if kc.br.Buffered() == 0 && netpipe.Alive(kc.Conn) {
			return kc
		}
		kc.Close()
	}
	return nil
}

func (p *connPool) put(kc *keptConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= maxIdleConns {
		kc.Close()
		return
	}
	p.idle = append(p.idle, kc)
}

// closeIdle drops the idle connections, and those put back later.
func (p *connPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, kc := range p.idle {
		kc.Close()
	}
	p.idle = nil
}

// close drops the idle connections; answers open now close theirs.
func (t *transport) close() {
	t.fallback.CloseIdleConnections()
	t.closeIdle()
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

// keptBody is an answer's body on a kept connection.
type keptBody struct {
	io.ReadCloser
	kc    *keptConn
	t     *transport
	stop  func() bool
	reuse bool

	once sync.Once
	eof  atomic.Bool // read to its end (Close may come from another goroutine)
}

func (b *keptBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof.Store(true)
	}
	return n, err
}

// Close keeps the connection if the body was read to its end, and closes
// it otherwise (a stream still running is not read to its end).
func (b *keptBody) Close() error {
	b.once.Do(func() {
		cancelled := !b.stop()
		if b.eof.Load() && b.reuse && !cancelled {
			b.ReadCloser.Close()
			b.t.put(b.kc)
			return
		}
		b.kc.Close()
		b.ReadCloser.Close()
	})
	return nil
}
