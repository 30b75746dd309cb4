package egress

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// tcpPair returns the two ends of a TCP connection on the test internet.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln := listenPublic(t)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); accepted <- c }()
	a, err := net.Dial("tcp", ln.Addr().String())
	b := <-accepted
	if err != nil || b == nil {
		t.Fatalf("connecting a pair: %v", err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// TestWriteBehindDeliversInOrderThenCloses writes more than the queue and
// the socket buffers hold to a peer that starts reading only after Close
// returned: every byte must arrive, in order, and then EOF.
func TestWriteBehindDeliversInOrderThenCloses(t *testing.T) {
	a, b := tcpPair(t)
	w := newWriteBehind(a)
	want := make([]byte, 8<<20)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	closed := make(chan error, 1)
	go func() {
		rest := want
		for len(rest) > 0 {
			n := min(len(rest), 1+rand.IntN(40<<10)) // TLS records and odd sizes
			if _, err := w.Write(rest[:n]); err != nil {
				closed <- err
				return
			}
			rest = rest[n:]
		}
		closed <- w.Close()
	}()
	time.Sleep(100 * time.Millisecond) // let the queue and the socket fill
	b.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(b)
	if err != nil {
		t.Fatalf("reading: %v after %d bytes", err, len(got))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %d bytes, not the %d written in order", len(got), len(want))
	}
	if err := <-closed; err != nil {
		t.Fatalf("writing or closing: %v", err)
	}
	if _, err := w.Write([]byte("late")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
	}
}

// gateConn is a net.Conn whose writes wait for the test to open a gate,
// and which records what each write carried.
type gateConn struct {
	net.Conn
	gate   chan struct{}
	mu     sync.Mutex
	writes [][]byte
	wrote  chan struct{}
}

func (g *gateConn) Write(b []byte) (int, error) {
	g.mu.Lock()
	g.writes = append(g.writes, append([]byte(nil), b...))
	g.mu.Unlock()
	g.wrote <- struct{}{}
	<-g.gate
	return len(b), nil
}

func (g *gateConn) Close() error                     { return nil }
func (g *gateConn) SetWriteDeadline(time.Time) error { return nil }

// TestWriteBehindCoalesces: what is queued while a write is under way
// goes out in one write, and a lone write leaves without waiting for
// more (a short one, as here, on the writer's own goroutine).
func TestWriteBehindCoalesces(t *testing.T) {
	g := &gateConn{gate: make(chan struct{}), wrote: make(chan struct{}, 16)}
	w := newWriteBehind(g)
	first := make(chan error, 1)
	go func() { _, err := w.Write([]byte("first")); first <- err }()
	<-g.wrote // the lone write reached the socket with nothing after it
	for i := range 10 {
		if _, err := w.Write([]byte{'0' + byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	close(g.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	<-g.wrote
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.writes) != 2 || string(g.writes[0]) != "first" || string(g.writes[1]) != "0123456789" {
		t.Fatalf("writes %q, want [first 0123456789]", g.writes)
	}
}

// TestWriteBehindStuckPeer: Close does not wait for a peer that reads
// nothing; the connection is closed once the linger runs out, and a
// Write blocked on a full queue is released by Close.
func TestWriteBehindStuckPeer(t *testing.T) {
	a, b := tcpPair(t)
	w := newWriteBehind(a)
	w.linger = 2 * time.Second
	blocked := make(chan error, 1)
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := w.Write(chunk); err != nil {
				blocked <- err
				return
			}
		}
	}()
	time.Sleep(200 * time.Millisecond) // the socket and the queue are full
	t0 := time.Now()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Fatalf("Close waited %v for a peer that does not read", d)
	}
	select {
	case err := <-blocked:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked Write: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release a Write waiting for room")
	}
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer goroutine outlived the linger")
	}
	// The proxy's end is closed: the peer, reading at last, gets what
	// had left and then the end of the stream (or a reset).
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, b); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("peer: %v", err)
	}
}

// TestWriteBehindReportsFailure: once the peer is gone, a later Write
// fails instead of queueing forever.
func TestWriteBehindReportsFailure(t *testing.T) {
	a, b := tcpPair(t)
	w := newWriteBehind(a)
	b.SetLinger(0)
	b.Close() // a reset
	chunk := make([]byte, 16<<10)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := w.Write(chunk); err != nil {
			w.Close()
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("writes to a reset connection kept succeeding")
}

// TestWriteBehindUnderTLSClose: the TLS layer, closing, queues its
// close_notify and then sets the write deadline to now; what it wrote
// before (a response) must still reach a client that reads late, whole,
// followed by a clean end. net/http ends a connection so.
func TestWriteBehindUnderTLSClose(t *testing.T) {
	a, b := tcpPair(t)
	// Small socket buffers: the end of the response is still in the
	// queue, not in the kernel, when the server closes.
	a.SetWriteBuffer(32 << 10)
	b.SetReadBuffer(32 << 10)
	srv := tls.Server(newWriteBehind(a), &tls.Config{Certificates: []tls.Certificate{serverCert(t, testServerCA, "wb.example.com")}})
	pool := x509.NewCertPool()
	pool.AddCert(testServerCA.Certificate())
	cli := tls.Client(b, &tls.Config{ServerName: "wb.example.com", RootCAs: pool})
	want := make([]byte, 4<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	served := make(chan error, 1)
	go func() {
		if _, err := srv.Write(want); err != nil {
			served <- err
			return
		}
		// As net/http ends a connection: close_notify first, the
		// close a while later.
		if err := srv.CloseWrite(); err != nil {
			served <- err
			return
		}
		time.Sleep(300 * time.Millisecond)
		served <- srv.Close()
	}()
	if err := cli.Handshake(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the server closes with most of the response queued
	cli.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(cli)
	if err != nil {
		t.Fatalf("client: %v after %d of %d bytes", err, len(got), len(want))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("client got %d bytes, not the %d sent", len(got), len(want))
	}
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
}

// TestWriteBehindWriteDeadline: a Write waiting for room in a full queue
// gives up at its deadline, and one past it fails at once.
func TestWriteBehindWriteDeadline(t *testing.T) {
	a, b := tcpPair(t)
	w := newWriteBehind(a)
	defer w.Close()
	w.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
	chunk := make([]byte, 64<<10)
	var err error
	for i := 0; i < 10000 && err == nil; i++ { // the peer reads nothing: socket and queue fill
		_, err = w.Write(chunk)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write past its deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if _, err := w.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write after the deadline: %v", err)
	}
	// Lifted, and the peer reading again: writes go through.
	w.SetWriteDeadline(time.Time{})
	go io.Copy(io.Discard, b)
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatalf("Write with the deadline lifted: %v", err)
	}
}
