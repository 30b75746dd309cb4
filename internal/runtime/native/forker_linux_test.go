package native

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
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
		f, err := startForker(exe, nil, nil)
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
	f, err := startForker(exe, nil, nil)
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

	n := devNull(t)
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

// TestForkerReportsChildFailure: a child that fails before its exec says
// which step failed and why, and the forker serves the next request. The
// child shares the forker's memory (CLONE_VM, on x86-64) and reports its
// error from the system call's result, not errno (which is the forker's);
// here its exec fails, several times running on the same stack, and then
// a good guest starts from the same forker.
func TestForkerReportsChildFailure(t *testing.T) {
	exe := forkerGuest(t)
	junk, err := sealedCopy("not-a-program", strings.NewReader("this is not a program\n"))
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	n := devNull(t)
	four := []int{n, n, n, n}
	req := forkRequest{UIDBase: 2_100_000_000, IDs: 65536}

	bad, err := startForker(junk, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bad.close)
	for i := range 3 {
		pid, pidfd, err := bad.fork(req, four)
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		if err == nil || !strings.HasPrefix(err.Error(), "starting guest: exec: ") || !errors.Is(err, unix.ENOEXEC) {
			t.Fatalf("fork %d from a forker whose guest is no program: pid %d, err %v; want starting guest: exec wrapping ENOEXEC", i, pid, err)
		}
	}
	if !bad.alive() {
		t.Fatal("the forker died after its children failed")
	}

	good, err := startForker(exe, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(good.close)
	for range 3 {
		_, pidfd, err := good.fork(req, four)
		if err != nil {
			t.Fatalf("a guest from the real binary: %v", err)
		}
		unix.Close(pidfd)
	}
}

// devNull returns a descriptor of /dev/null, closed when the test ends:
// what a fork request passes for the guest's descriptors where the test
// reads none of them.
func devNull(t *testing.T) int {
	t.Helper()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { null.Close() })
	return int(null.Fd())
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

// TestForkerKilledMidFork: a forker killed (with its daemon) between a
// guest's clone and the exec leaves nothing waiting. A child it had not
// yet woken (the id maps unwritten) used to wait for ever on a pipe whose
// other end it held itself; it now exits. Forks run in a loop while the
// forker is killed at varying times; the children it leaves are
// reparented to this process (a subreaper for the test), and none may
// stay the forker's image for long.
func TestForkerKilledMidFork(t *testing.T) {
	exe := forkerGuest(t)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	self, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	n := devNull(t)
	req := forkRequest{UIDBase: 2_100_000_000, IDs: 65536}
	for i := range 40 {
		f, err := startForker(exe, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.sock.Close() })
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				_, pidfd, err := f.fork(req, []int{n, n, n, n})
				if err != nil {
					return // the forker is gone
				}
				unix.Close(pidfd) // the guest reads /dev/null and exits
			}
		}()
		time.Sleep(time.Duration(2+i%7) * time.Millisecond)
		f.cmd.Process.Kill()
		<-f.dead
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			// A child holds the forker's end of the socket.
			t.Errorf("round %d: the fork loop still waits for an answer 5 s after the forker died", i)
		}
		if t.Failed() {
			break
		}
	}
	// Children of a forker it had cloned but not woken run the forker's
	// image; a guest runs the sealed binary.
	deadline := time.Now().Add(5 * time.Second)
	left := childrenRunning(self)
	for len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		left = childrenRunning(self)
	}
	for _, pid := range left {
		unix.Kill(pid, unix.SIGKILL)
	}
	reapChildren(t)
	if len(left) > 0 {
		t.Fatalf("%d children of killed forkers still wait: %v", len(left), left)
	}
}

// reapChildren reaps this process's exited children that nothing else
// waits for (orphans reparented to it as a subreaper), for up to a
// second.
func reapChildren(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err != nil {
			return // no children left
		}
		if pid == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// childrenRunning lists this process's live children whose executable is
// image (a zombie has none).
func childrenRunning(image string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil || !strings.Contains(string(st), fmt.Sprintf("\nPPid:\t%d\n", os.Getpid())) {
			continue
		}
		if img, err := os.Readlink("/proc/" + e.Name() + "/exe"); err == nil && img == image {
			pid, _ := strconv.Atoi(e.Name())
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestForkerIntoCgroup: a request that brings a cgroup v2 directory has
// its guest cloned straight into it (CLONE_INTO_CGROUP): the guest's
// /proc/PID/cgroup names it from its first instant. Run wherever a
// cgroup2 hierarchy is mounted (a hybrid host's unified one too).
func TestForkerIntoCgroup(t *testing.T) {
	exe := forkerGuest(t)
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	root := ""
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[2] == "cgroup2" {
			root = f[1]
			break
		}
	}
	if root == "" {
		t.Skip("no cgroup2 hierarchy mounted")
	}
	name := fmt.Sprintf("paddock-forker-test-%d", os.Getpid())
	dir := root + "/" + name
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for os.Remove(dir) != nil && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // until the guest is gone
		}
	})
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	f, err := startForker(exe, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.close)
	// The guest waits on its sync socket for a config that never comes.
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	n := devNull(t)
	pid, pidfd, err := f.fork(forkRequest{UIDBase: 2_100_000_000, IDs: 65536, UseCgroup: true}, []int{n, n, pair[1], n, int(cg.Fd())})
	unix.Close(pair[1])
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 5000)
		unix.Close(pidfd)
	}()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "0::/"+name+"\n") {
		t.Fatalf("the guest's cgroups:\n%s\nwant 0::/%s", b, name)
	}
}
