package native

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/shrink"
)

// exitWatcher waits for the exits of every guest in one goroutine: their
// pidfds are in one epoll set, and that set is in Go's netpoller, so a
// guest that runs for hours costs the daemon no goroutine. With one
// goroutine per guest parked on its pidfd, a thousand idle sandboxes
// kept a thousand goroutines and netpoller descriptors, which the Go
// runtime never frees, and the daemon stayed larger after they were
// removed (issue 21).
type exitWatcher struct {
	once sync.Once
	err  error
	ep   int // the epoll set's fd

	mu sync.Mutex
	// waiting maps a pidfd in the set to what to run when its process
	// exits. A pidfd leaves the set and the map before its function runs,
	// and the function closes it: its number cannot be reused while it is
	// here.
	waiting map[int32]func()
	peak    int // for shrink.Map
}

// exits is the daemon's one exit watcher.
var exits exitWatcher

// add runs exited, in a goroutine of its own, once the process of pidfd
// has exited. pidfd must stay open until then; exited should close it.
func (w *exitWatcher) add(pidfd int, exited func()) error {
	w.once.Do(w.start)
	if w.err != nil {
		return w.err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting[int32(pidfd)] = exited
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(pidfd)}
	if err := unix.EpollCtl(w.ep, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		delete(w.waiting, int32(pidfd))
		return fmt.Errorf("watching the guest's exit: %w", err)
	}
	return nil
}

func (w *exitWatcher) start() {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		w.err = fmt.Errorf("watching guests' exits: epoll_create1: %w", err)
		return
	}
	// Non-blocking, so that os.NewFile hands it to the netpoller: an epoll
	// set turns readable when one of its fds has an event.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		w.err = fmt.Errorf("watching guests' exits: %w", err)
		return
	}
	f := os.NewFile(uintptr(fd), "exits")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		w.err = fmt.Errorf("watching guests' exits: %w", err)
		return
	}
	w.ep = fd
	w.waiting = map[int32]func(){}
	go w.run(f, rc.Read)
}

// run takes the exited processes' functions out of the set as their
// pidfds turn readable, and runs each in a goroutine of its own: one may
// block (a held activation), and the others must not wait for it. f is
// kept alive here: it owns the set's fd.
func (w *exitWatcher) run(f *os.File, read func(func(fd uintptr) bool) error) {
	events := make([]unix.EpollEvent, 64)
	var ready []func()
	take := func(fd uintptr) bool {
		n, err := unix.EpollWait(int(fd), events, 0)
		if err != nil || n <= 0 {
			return false // wait until the set turns readable
		}
		w.mu.Lock()
		for _, ev := range events[:n] {
			if exited, ok := w.waiting[ev.Fd]; ok {
				delete(w.waiting, ev.Fd)
				unix.EpollCtl(int(fd), unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
				ready = append(ready, exited)
			}
		}
		w.waiting = shrink.Map(w.waiting, &w.peak)
		w.mu.Unlock()
		return true
	}
	for {
		if err := read(take); err != nil {
			// Only a closed set fails, and the set is never closed.
			panic(fmt.Sprintf("watching guests' exits: %v (%v)", err, f.Name()))
		}
		for i, exited := range ready {
			go exited()
			ready[i] = nil
		}
		ready = ready[:0]
	}
}
