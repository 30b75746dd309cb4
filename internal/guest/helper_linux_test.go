package guest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/wire"
)

// fastSide plays the fast guest's part for a helper (internal/guestc's
// pass_on): it holds one end of the helper's socket and passes ops on.
type fastSide struct {
	t    *testing.T
	mu   sync.Mutex
	sock int           // -1 once closed
	done chan struct{} // closed when serveHelper returned
}

// startHelper runs serveHelper with idle on a socket pair, files under
// a temporary root (startFileGuest's).
func startHelper(t *testing.T, idle time.Duration) *fastSide {
	t.Helper()
	startFileGuest(t) // the root
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[1]), "helper")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(guestapi.ServeConfig{Workdir: "/workspace"}, nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	fs := &fastSide{t: t, sock: fds[0], done: make(chan struct{})}
	go func() {
		defer close(fs.done)
		s.serveHelper(c.(*net.UnixConn), idle)
	}()
	t.Cleanup(func() {
		fs.close()
		<-fs.done
	})
	return fs
}

// send sends one byte with fds, as pass_on does.
func (fs *fastSide) send(fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.sock < 0 {
		return unix.EPIPE
	}
	return unix.Sendmsg(fs.sock, []byte{0}, oob, nil, 0)
}

func (fs *fastSide) close() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.sock >= 0 {
		unix.Close(fs.sock)
		fs.sock = -1
	}
}

// memfd returns a memfd holding b.
func memfd(t *testing.T, b []byte) int {
	t.Helper()
	fd, err := unix.MemfdCreate("request", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(fd, b); err != nil {
		t.Fatal(err)
	}
	return fd
}

// fdReader reads a descriptor without owning it.
type fdReader int

func (r fdReader) Read(b []byte) (int, error) {
	n, err := unix.Read(int(r), b)
	if n <= 0 && err == nil {
		return 0, io.EOF
	}
	return max(n, 0), err
}

// client is a guest client whose every connection is passed on to the
// helper after its request frame was read, as the fast guest passes a
// file op on.
func (fs *fastSide) client() *guestapi.Client {
	c := guestapi.NewClient(func(ctx context.Context) (net.Conn, error) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		go func() {
			defer unix.Close(fds[1])
			f, err := wire.NewReader(fdReader(fds[1])).Read()
			if err != nil || f.Type != wire.Request {
				return
			}
			m := memfd(fs.t, f.Payload)
			defer unix.Close(m)
			fs.send(fds[1], m)
		}()
		f := os.NewFile(uintptr(fds[0]), "ours")
		defer f.Close()
		return net.FileConn(f)
	})
	fs.t.Cleanup(c.Close)
	return c
}

// leaving reports whether the helper shut its side of the socket within
// wait.
func (fs *fastSide) leaving(wait time.Duration) bool {
	fs.t.Helper()
	fs.mu.Lock()
	defer fs.mu.Unlock()
	pfd := []unix.PollFd{{Fd: int32(fs.sock), Events: unix.POLLIN}}
	n, err := unix.Poll(pfd, int(wait/time.Millisecond))
	if err != nil && !errors.Is(err, unix.EINTR) {
		fs.t.Fatal(err)
	}
	if n == 0 {
		return false
	}
	b := make([]byte, 1)
	r, err := unix.Read(fs.sock, b)
	if r != 0 || err != nil {
		fs.t.Fatalf("the helper sent %d bytes (%v) on its socket", r, err)
	}
	return true
}

// TestHelperServesPassedOps: the helper serves the file ops passed on to
// it, answers an op that is not its own (a process's, PID 1's
// environment) with an error naming it, and
// drops messages that are not one connection and one request (no
// descriptor, one, three, a pipe or an oversized file as the request)
// and goes on. Idle, it shuts its side of the socket, still serves what
// was passed on before the fast guest closed its side, and returns then.
func TestHelperServesPassedOps(t *testing.T) {
	fs := startHelper(t, 300*time.Millisecond)
	c := fs.client()
	ctx := fileCtx(t)
	if _, err := c.WriteFile(ctx, guestapi.FileRequest{Path: "a.txt"}, strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	if fi, err := c.Stat(ctx, guestapi.FileRequest{Path: "/workspace/a.txt"}); err != nil || fi.Size != 5 {
		t.Fatalf("stat of the file written relative to the workdir: %+v, %v", fi, err)
	}
	if _, err := c.Processes(ctx); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `unknown op "list"`) {
		t.Fatalf("a process op passed to the helper: %v", err)
	}
	// Nor the ops beyond files and ports that are PID 1's.
	if err := c.SetEnv(ctx, []string{"A=b"}); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `unknown op "set_env"`) {
		t.Fatalf("set_env passed to the helper: %v", err)
	}

	// Hostile or broken messages.
	conn := func() int {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fds[1]) })
		return fds[0]
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	big := memfd(t, nil)
	if err := unix.Ftruncate(big, wire.MaxPayload+1); err != nil {
		t.Fatal(err)
	}
	ok := memfd(t, []byte(`{"op":"file.stat","file":{"path":"a.txt"}}`))
	for _, m := range [][]int{nil, {conn()}, {conn(), ok, conn()}, {conn(), p[0]}, {conn(), big}} {
		if err := fs.send(m...); err != nil {
			t.Fatal(err)
		}
	}
	unix.Close(p[0])
	unix.Close(p[1])
	unix.Close(big)
	unix.Close(ok)
	if _, err := c.Stat(ctx, guestapi.FileRequest{Path: "a.txt"}); err != nil {
		t.Fatalf("stat after the broken messages: %v", err)
	}

	// Idle: the helper leaves, serving what comes before our close.
	if !fs.leaving(5 * time.Second) {
		t.Fatal("the helper did not leave when idle")
	}
	if got, err := readAllFile(c, "a.txt"); err != nil || got != "hello" {
		t.Fatalf("a read passed on as the helper left: %q, %v", got, err)
	}
	select {
	case <-fs.done:
		t.Fatal("the helper returned before the fast guest closed its side")
	default:
	}
	fs.close()
	select {
	case <-fs.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the helper stays after the fast guest closed its side")
	}
}

func readAllFile(c *guestapi.Client, p string) (string, error) {
	_, ds, err := c.ReadFile(context.Background(), guestapi.FileRequest{Path: p})
	if err != nil {
		return "", err
	}
	defer ds.Close()
	b, err := io.ReadAll(ds)
	return string(b), err
}

// TestHelperStaysWhileServing: an op in flight (a watch) keeps the
// helper however long it lasts; it leaves idle after the op's end.
func TestHelperStaysWhileServing(t *testing.T) {
	const idle = 200 * time.Millisecond
	fs := startHelper(t, idle)
	c := fs.client()
	w, err := c.Watch(fileCtx(t), guestapi.FileRequest{Path: "/workspace"})
	if err != nil {
		t.Fatal(err)
	}
	if fs.leaving(4 * idle) {
		t.Fatal("the helper left with a watch open")
	}
	w.Close()
	start := time.Now()
	if !fs.leaving(5 * time.Second) {
		t.Fatal("the helper did not leave after the watch ended")
	}
	if d := time.Since(start); d < idle/2 {
		t.Fatalf("the helper left %s after the watch ended, idle is %s", d, idle)
	}
	fs.close()
	<-fs.done
}
