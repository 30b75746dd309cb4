package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
)

// maxIdleStreamConns bounds the connections kept for the next stream.
const maxIdleStreamConns = 16

// streamConns carries one-way frame streams (exec, attach, logs) on
// connections of the SDK's own: the calling goroutine writes the request
// and reads the answer itself. net/http's Transport hands each request to
// a writer goroutine and each answer back from a reader goroutine; on a
// small VM those hand-offs are a measurable part of a short exec.
type streamConns struct {
	dial func(ctx context.Context) (net.Conn, error)

	mu     sync.Mutex
	idle   []*streamConn
	closed bool
}

type streamConn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer
}

// get returns an idle connection that is still open, or nil.
func (p *streamConns) get() *streamConn {
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

func (p *streamConns) put(sc *streamConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle) >= maxIdleStreamConns {
		sc.Close()
		return
	}
	p.idle = append(p.idle, sc)
}

// close drops the idle connections; streams open now close theirs.
func (p *streamConns) close() {
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
func (p *streamConns) roundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	sc := p.get()
	kept := sc != nil
	for {
		if sc == nil {
			conn, err := p.dial(ctx)
			if err != nil {
				return nil, err
			}
			sc = &streamConn{Conn: conn, br: bufio.NewReaderSize(conn, 64<<10), bw: bufio.NewWriterSize(conn, 4<<10)}
		}
		stop := context.AfterFunc(ctx, func() { sc.Close() })
		err := req.Write(sc.bw)
		if err == nil {
			err = sc.bw.Flush()
		}
		if err != nil {
			stop()
			sc.Close()
			if kept && ctx.Err() == nil && req.GetBody != nil {
				if req.Body, err = req.GetBody(); err == nil {
					sc, kept = nil, false
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
		resp.Body = &streamBody{ReadCloser: resp.Body, sc: sc, p: p, stop: stop, reuse: !resp.Close}
		return resp, nil
	}
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// streamBody is an answer's body on a streamConn.
type streamBody struct {
	io.ReadCloser
	sc    *streamConn
	p     *streamConns
	stop  func() bool
	reuse bool

	once sync.Once
	eof  bool
}

func (b *streamBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

// Close keeps the connection if the body was read to its end, and closes
// it otherwise (a stream still running is not read to its end).
func (b *streamBody) Close() error {
	b.once.Do(func() {
		cancelled := !b.stop()
		if b.eof && b.reuse && !cancelled {
			b.ReadCloser.Close()
			b.p.put(b.sc)
			return
		}
		b.sc.Close()
		b.ReadCloser.Close()
	})
	return nil
}
