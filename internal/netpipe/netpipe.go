// Package netpipe owns raw byte pipes between connections: handing out
// the bytes a buffered reader took before a connection stopped being
// framed (or stopped being HTTP), half-closes, and splicing two
// connections together. It is free of cgo, so that the SDK can use it.
package netpipe

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
)

// WithPrefix returns conn with pre read before anything else: the bytes a
// buffered reader took from conn before it became a raw pipe (a hijacked
// HTTP connection's, a frame reader's). It keeps conn's CloseWrite.
func WithPrefix(conn net.Conn, pre []byte) net.Conn {
	if len(pre) == 0 {
		return conn
	}
	return &prefixConn{Conn: conn, pre: pre}
}

// WithBuffered is WithPrefix with a copy of what br holds; br must not be
// read afterwards.
func WithBuffered(conn net.Conn, br *bufio.Reader) net.Conn {
	if br == nil || br.Buffered() == 0 {
		return conn
	}
	p, _ := br.Peek(br.Buffered())
	return WithPrefix(conn, append([]byte(nil), p...))
}

type prefixConn struct {
	net.Conn
	mu  sync.Mutex
	pre []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	p.mu.Lock()
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		p.mu.Unlock()
		return n, nil
	}
	p.mu.Unlock()
	return p.Conn.Read(b)
}

func (p *prefixConn) CloseWrite() error { return closeWrite(p.Conn) }

type closeWriter interface{ CloseWrite() error }

// closeWrite half-closes conn's write side, or reports that it cannot.
func closeWrite(conn io.Writer) error {
	if cw, ok := conn.(closeWriter); ok {
		return cw.CloseWrite()
	}
	return errNoHalfClose
}

var errNoHalfClose = errors.New("connection cannot be half-closed")

// Splice copies bytes both ways between a and b until both directions
// are done, then closes both. When one side reaches EOF the other's write
// side is half-closed, so that a peer waiting for EOF (an echo, a request
// body without a length) gets it while answers still flow back. An error
// either way (a reset, a close) closes both at once. It returns the bytes
// copied from a to b and from b to a.
func Splice(a, b io.ReadWriteCloser) (aToB, bToA int64) {
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			a.Close()
			b.Close()
		})
	}
	pipe := func(dst, src io.ReadWriteCloser) int64 {
		n, err := io.Copy(dst, src)
		if err != nil || closeWrite(dst) != nil {
			closeBoth()
		}
		return n
	}
	done := make(chan int64, 1)
	go func() { done <- pipe(b, a) }()
	bToA = pipe(a, b)
	aToB = <-done
	closeBoth()
	return aToB, bToA
}
