// Package fdnotify tells when connections have input, or other
// descriptors turn readable (a pidfd, once its process exits), for any
// number of them on one goroutine: a descriptor that waits long for rare
// input (an idle sandbox's process stream, its guest's exit) then costs
// no parked goroutine, whose descriptor the Go runtime never frees and
// whose stack stays for as long as it waits (issue 21).
//
// A Notifier is an epoll instance of its own, itself waited on through
// the Go runtime's poller, so that it holds no thread either. Each Arm
// registers a connection's descriptor once (EPOLLONESHOT): the callback
// runs, on a goroutine of its own, when the connection has input, has
// ended or failed, at once if it already has.
package fdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/shrink"
)

// ErrNoDescriptor is returned for a connection with no descriptor of its
// own to watch (an in-memory pipe, a wrapper that hides it).
var ErrNoDescriptor = errors.New("the connection has no descriptor to watch")

// Notifier watches connections for input.
type Notifier struct {
	ep *os.File // the epoll instance, pollable by the runtime

	mu      sync.Mutex
	watches map[uint64]*Watch // by token: a stale event finds none
	peak    int               // for shrink.Map
	next    uint64
	closed  bool
}

// New makes a Notifier and starts its goroutine; Close ends both.
func New() (*Notifier, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating epoll instance: %w", err)
	}
	// Non-blocking, so that os.NewFile hands it to the runtime's poller:
	// the goroutine waiting for events then holds no thread.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("creating epoll instance: %w", err)
	}
	n := &Notifier{ep: os.NewFile(uintptr(fd), "fdnotify"), watches: map[uint64]*Watch{}}
	rc, err := n.ep.SyscallConn()
	if err != nil {
		n.ep.Close()
		return nil, fmt.Errorf("creating epoll instance: %w", err)
	}
	go n.run(rc)
	return n, nil
}

// Close stops the Notifier: armed callbacks that did not run never do.
func (n *Notifier) Close() error {
	n.mu.Lock()
	n.closed = true
	n.watches = nil
	n.mu.Unlock()
	return n.ep.Close()
}

// run hands out the events until Close.
func (n *Notifier) run(rc syscall.RawConn) {
	evs := make([]unix.EpollEvent, 64)
	for {
		err := rc.Read(func(fd uintptr) bool {
			for {
				k, err := unix.EpollWait(int(fd), evs, 0)
				if err == unix.EINTR {
					continue
				}
				if err != nil || k == 0 {
					// None left: wait for the runtime's poller to say the
					// instance is readable (an edge per new event).
					return err != nil
				}
				for _, ev := range evs[:k] {
					n.fire(uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32)
				}
			}
		})
		if err != nil {
			return // closed
		}
	}
}

// fire runs the callback armed on the watch of token, if any.
func (n *Notifier) fire(token uint64) {
	n.mu.Lock()
	w := n.watches[token]
	n.mu.Unlock()
	if w == nil {
		return
	}
	w.mu.Lock()
	fn := w.fn
	w.fn = nil
	w.mu.Unlock()
	if fn != nil {
		go fn()
	}
}

// Watch is one connection's registration.
type Watch struct {
	n     *Notifier
	rc    syscall.RawConn
	token uint64

	mu    sync.Mutex
	fn    func() // armed, not yet run
	added bool   // the descriptor is in the epoll instance
}

// Watch returns a watch of conn, or ErrNoDescriptor. A wrapper that
// gives its connection with NetConn (as crypto/tls) is looked through;
// reads still go through the wrapper.
func (n *Notifier) Watch(conn net.Conn) (*Watch, error) {
	for {
		switch c := conn.(type) {
		case syscall.Conn:
			return n.WatchFile(c)
		case interface{ NetConn() net.Conn }:
			conn = c.NetConn()
		default:
			return nil, ErrNoDescriptor
		}
	}
}

// WatchFile returns a watch of any descriptor that turns readable: a
// socket, a pipe, a pidfd (readable once its process has exited). It
// need not be in the Go runtime's poller.
func (n *Notifier) WatchFile(f syscall.Conn) (*Watch, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	w := &Watch{n: n, rc: rc}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, net.ErrClosed
	}
	n.next++
	w.token = n.next
	n.watches[w.token] = w
	return w, nil
}

// Arm has fn run once, on a goroutine of its own, when the connection
// has input to read, has ended or failed (at once if it has already).
// An error (the connection is closed, say) leaves fn unarmed.
func (w *Watch) Arm(fn func()) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT,
		Fd: int32(uint32(w.token)), Pad: int32(uint32(w.token >> 32))}
	epfd, err := w.n.ep.SyscallConn()
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fn = fn
	var cerr error
	ctl := func(fd uintptr) {
		err := epfd.Control(func(ep uintptr) {
			// A fired one-shot registration stays, disabled: it is
			// re-enabled with MOD.
			op := unix.EPOLL_CTL_MOD
			if !w.added {
				op = unix.EPOLL_CTL_ADD
			}
			cerr = unix.EpollCtl(int(ep), op, int(fd), &ev)
			if cerr == nil {
				w.added = true
			}
		})
		if cerr == nil {
			cerr = err
		}
	}
	// Control holds the descriptor open: it is not closed (and its
	// number reused) under the registration.
	if err := w.rc.Control(ctl); err != nil {
		cerr = err
	}
	if cerr != nil {
		w.fn = nil
		return fmt.Errorf("watching a connection: %w", cerr)
	}
	return nil
}

// Pending reports how many bytes the connection has ready to read (0 if
// that cannot be told).
func (w *Watch) Pending() int {
	var n int
	w.rc.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	return n
}

// Stop drops the watch: an armed callback not yet handed to its
// goroutine never runs.
// The registration itself goes when the connection is closed.
func (w *Watch) Stop() {
	w.mu.Lock()
	w.fn = nil
	w.mu.Unlock()
	w.n.mu.Lock()
	delete(w.n.watches, w.token)
	w.n.watches = shrink.Map(w.n.watches, &w.n.peak)
	w.n.mu.Unlock()
	if epfd, err := w.n.ep.SyscallConn(); err == nil {
		w.rc.Control(func(fd uintptr) {
			epfd.Control(func(ep uintptr) { unix.EpollCtl(int(ep), unix.EPOLL_CTL_DEL, int(fd), nil) })
		})
	}
}
