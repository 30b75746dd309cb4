package native

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestForkerOutlivesItsStarter: the forker's death signal follows the
// thread that started it, and the daemon ends threads (a goroutine that
// returns locked to its thread: namespace work, the memory trim). A
// forker started from a thread that then ends keeps running; one that is
// killed is seen dead at once, not taken for alive while a zombie.
func TestForkerOutlivesItsStarter(t *testing.T) {
	exe := forkerGuest(t)
	got := make(chan *forker, 1)
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // returns locked: this thread ends
		f, err := startForker(exe)
		if err != nil {
			errc <- err
			return
		}
		got <- f
	}()
	var f *forker
	select {
	case err := <-errc:
		t.Fatal(err)
	case f = <-got:
	}
	t.Cleanup(f.close)
	// The starting goroutine's thread has ended; a death signal tied to
	// it would have come by now.
	time.Sleep(200 * time.Millisecond)
	if !f.alive() {
		t.Fatal("the forker died with the thread that started it")
	}
	f.cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for f.alive() {
		if time.Now().After(deadline) {
			t.Fatal("a killed forker is still taken for alive")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestForkerRefusesBadRequests: the forker (C, one thread) answers each
// malformed request with an error that names what was wrong and wraps
// EINVAL, sends no pidfd, and keeps serving: a good request after them
// starts a guest, which the forker reaps once it exits.
func TestForkerRefusesBadRequests(t *testing.T) {
	exe := forkerGuest(t)
	f, err := startForker(exe)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", f.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nThreads:\t1\n") {
		t.Fatalf("the forker is not one thread:\n%s", status)
	}

	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	n := int(null.Fd())
	four := []int{n, n, n, n}
	nine := []int{n, n, n, n, n, n, n, n, n}
	good := forkRequest{UIDBase: 2_100_000_000, IDs: 65536}
	unknown := good.Encode()
	unknown[8] |= 0x80 // a flag no forker knows, in either byte order
	unknown[11] |= 0x80
	for _, c := range []struct {
		name string
		msg  []byte
		fds  []int
		want string
	}{
		{"short", []byte{1, 2, 3}, four, "fork request is 3 bytes, want 12"},
		{"long", append(good.Encode(), 0), four, "fork request is 13 bytes, want 12"},
		{"unknown flags", unknown, four, "unknown flags"},
		{"no ids", forkRequest{UIDBase: 2_100_000_000}.Encode(), four, "maps no ids"},
		{"too few fds", good.Encode(), four[:2], "carries 2 fds, want 4"},
		{"no cgroup fd", forkRequest{UIDBase: 2_100_000_000, IDs: 65536, UseCgroup: true}.Encode(), four, "carries 4 fds, want 5"},
		{"too many fds", good.Encode(), nine, "fork request too long"},
	} {
		pid, pidfd, err := f.send(c.msg, c.fds)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, unix.EINVAL) {
			t.Errorf("%s: got pid %d, err %v; want an error saying %q wrapping EINVAL", c.name, pid, err, c.want)
		}
		if pidfd >= 0 {
			unix.Close(pidfd)
			t.Errorf("%s: the refusal came with a pidfd", c.name)
		}
	}

	// The guest reads its config from the sync socket, here /dev/null,
	// and exits.
	pid, pidfd, err := f.fork(good, four)
	if err != nil {
		t.Fatalf("a good request after the bad ones: %v", err)
	}
	defer unix.Close(pidfd)
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 10_000); err != nil || n != 1 {
		t.Fatalf("the guest did not exit: poll %d, %v", n, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the forker did not reap guest %d", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !f.alive() {
		t.Fatal("the forker died")
	}
}

// forkerGuest skips the test unless it runs as root (the forker makes a
// mount namespace of its own), and returns the sealed guest binary for a
// forker to fork from.
func forkerGuest(t *testing.T) *os.File {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (the forker runs in a mount namespace of its own)")
	}
	exe, err := sealedSelf(guestBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { exe.Close() })
	return exe
}
