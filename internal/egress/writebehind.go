package egress

import (
	"net"
	"os"
	"sync"
	"time"
)

// writeBehindMax bounds what a writeBehind holds: a writer that gets that
// far ahead of the socket waits. It is also the most one write hands the
// kernel.
const writeBehindMax = 256 << 10

// writeBehindDirect: a write shorter than this (less than a full TLS
// record: a handshake flight, a small response, an event of a stream)
// that finds nothing queued or being written is written at once by the
// caller. Handing it to the goroutine would cost a wake-up and, on a
// loaded machine, another thread's scheduling delay, on every handshake
// and every small response: latency, where batching buys nothing.
const writeBehindDirect = 16 << 10

// writeBehindLinger bounds how long a closed writeBehind keeps trying to
// deliver what it still holds to a peer that does not read.
const writeBehindLinger = 5 * time.Second

var writeBehindBufs = sync.Pool{New: func() any { b := make([]byte, 0, writeBehindMax); return &b }}

// writeBehind is a connection whose writes are queued and written out by
// a goroutine of its own, all that has queued up in one system call.
//
// It sits under the TLS layer of an intercepted connection, which writes
// each record (16 KiB at most) with a write of its own. On this path a
// write is expensive: it runs the TCP send and, over the sandbox's veth,
// the client's TCP input too, then wakes the client. Queued, the records
// of a fast response go out many to a call (a 1 GiB download: about 5,000
// writes instead of 65,000, and the client wakes as rarely), and the
// encryption of the next records overlaps the sending of the last ones.
// Nothing is held back: the goroutine writes as soon as there is anything
// to write, so a lone record (an event of a stream) leaves at once.
// Measured on two shared cores, the sandbox's client saves more CPU than
// the proxy's hand-offs cost, but not by much: the sandbox's CPU is what
// this buys.
//
// A failed write is reported by the next Write; bytes an earlier Write
// accepted may then never have left, as with a kernel socket buffer. Its
// buffers go back to a pool whenever the queue runs dry, so an idle
// connection holds none.
//
// A write deadline bounds Write (its wait for room in the queue), not the
// writing out of what Write already accepted: the TLS layer, closing,
// sends its close_notify alert and then sets the write deadline to now so
// that later writes fail, and the response queued before the alert must
// still leave. Only Close bounds that, by writeBehindLinger.
type writeBehind struct {
	net.Conn
	mu      sync.Mutex
	cond    sync.Cond // broadcast when buf gains or loses bytes, or err or closed is set
	buf     []byte    // queued, not yet handed to the socket
	writing bool      // a write is under way: the goroutine's, or a short one of Write's caller
	err     error
	closed  bool
	started bool
	done    chan struct{} // closed when the goroutine has ended
	linger  time.Duration
	wdl     time.Time // the write deadline, for Write
}

func newWriteBehind(c net.Conn) *writeBehind {
	w := &writeBehind{Conn: c, done: make(chan struct{}), linger: writeBehindLinger}
	w.cond.L = &w.mu
	return w
}

func (w *writeBehind) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for len(b) > 0 {
		for w.err == nil && !w.closed && len(w.buf) >= writeBehindMax && !w.pastDeadline() {
			w.waitRoom()
		}
		switch {
		case w.err != nil:
			return n, w.err
		case w.closed:
			return n, net.ErrClosed
		case w.pastDeadline():
			return n, &net.OpError{Op: "write", Net: "tcp", Source: w.LocalAddr(), Addr: w.RemoteAddr(), Err: os.ErrDeadlineExceeded}
		}
		if len(w.buf) == 0 && !w.writing && n == 0 && len(b) < writeBehindDirect {
			return w.writeDirect(b)
		}
		if !w.started {
			w.started = true
			go w.run()
		}
		if w.buf == nil {
			w.buf = (*writeBehindBufs.Get().(*[]byte))[:0]
		}
		m := min(len(b), writeBehindMax-len(w.buf))
		w.buf = append(w.buf, b[:m]...)
		b, n = b[m:], n+m
		w.cond.Broadcast()
	}
	return n, nil
}

// writeDirect writes b on the caller's goroutine, with w.mu held on entry
// and on return, and with the write deadline on the socket meanwhile.
func (w *writeBehind) writeDirect(b []byte) (int, error) {
	w.writing = true
	w.Conn.SetWriteDeadline(w.wdl)
	w.mu.Unlock()
	n, err := w.Conn.Write(b)
	w.mu.Lock()
	w.writing = false
	if !w.closed {
		w.Conn.SetWriteDeadline(time.Time{}) // what was queued before goes out unbounded (see writeBehind)
	}
	if err != nil && w.err == nil {
		w.err = err
	}
	w.cond.Broadcast()
	return n, err
}

func (w *writeBehind) pastDeadline() bool {
	return !w.wdl.IsZero() && !time.Now().Before(w.wdl)
}

// waitRoom waits, with w.mu held, for the goroutine to take the queue or
// for the write deadline.
func (w *writeBehind) waitRoom() {
	if w.wdl.IsZero() {
		w.cond.Wait()
		return
	}
	t := time.AfterFunc(time.Until(w.wdl), func() {
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
	})
	w.cond.Wait()
	t.Stop()
}

// SetWriteDeadline bounds Write (see writeBehind).
func (w *writeBehind) SetWriteDeadline(t time.Time) error {
	w.mu.Lock()
	w.wdl = t
	w.cond.Broadcast()
	w.mu.Unlock()
	return nil
}

func (w *writeBehind) SetDeadline(t time.Time) error {
	w.SetWriteDeadline(t)
	return w.Conn.SetReadDeadline(t)
}

// run writes out what Write queues until the connection is closed with
// nothing left to write, or a write fails; then it closes the connection
// if Close was called.
func (w *writeBehind) run() {
	defer close(w.done)
	w.mu.Lock()
	for {
		// (writing, here, is a direct write by Write's caller.)
		for w.err == nil && (w.writing || len(w.buf) == 0 && !w.closed) {
			w.cond.Wait()
		}
		if w.err != nil || len(w.buf) == 0 {
			break
		}
		out := w.buf
		w.buf = nil
		w.writing = true
		w.mu.Unlock()
		_, err := w.Conn.Write(out)
		out = out[:0]
		writeBehindBufs.Put(&out)
		w.mu.Lock()
		w.writing = false
		if err != nil && w.err == nil {
			w.err = err
		}
		w.cond.Broadcast()
	}
	if w.buf != nil {
		b := w.buf[:0]
		writeBehindBufs.Put(&b)
		w.buf = nil
	}
	closed := w.closed
	w.mu.Unlock()
	if closed {
		w.Conn.Close()
	}
}

// Close closes the connection once what is queued has been written: at
// once when nothing is, otherwise in the background, for at most
// writeBehindLinger, as the kernel does with what a socket's send buffer
// holds.
func (w *writeBehind) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return net.ErrClosed
	}
	w.closed = true
	started := w.started
	pending := len(w.buf) > 0 || w.writing
	if started && pending {
		w.Conn.SetWriteDeadline(time.Now().Add(w.linger))
	}
	w.cond.Broadcast()
	w.mu.Unlock()
	if !started {
		return w.Conn.Close()
	}
	if !pending {
		<-w.done // run saw closed with nothing left: it closes the connection
	}
	return nil // otherwise run closes it when what is queued has left
}
