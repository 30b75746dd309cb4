package native

import (
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestExitWatcher: the one watcher tells each process's exit to its own
// function, whichever order they end in, also for a process that ended
// before it was added, and holds no goroutine per process meanwhile.
func TestExitWatcher(t *testing.T) {
	const n = 20
	var w exitWatcher
	cmds := make([]*exec.Cmd, n)
	ended := make([]chan struct{}, n)
	before := runtime.NumGoroutine()
	for i := range n {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if i == 0 {
			// Ended (a zombie) before it is watched.
			cmd.Process.Signal(unix.SIGKILL)
			time.Sleep(50 * time.Millisecond)
		}
		pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		ended[i] = make(chan struct{})
		done := ended[i]
		if err := w.add(pidfd, func() {
			unix.Close(pidfd)
			close(done)
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The watcher's own goroutine, none per process.
	if g := runtime.NumGoroutine() - before; g > 1 {
		t.Errorf("%d more goroutines watching %d processes", g, n)
	}
	waitEnded := func(i int) {
		t.Helper()
		select {
		case <-ended[i]:
		case <-time.After(10 * time.Second):
			t.Fatalf("process %d's exit not seen", i)
		}
	}
	waitEnded(0)
	// From the last to the second: each exit reaches its function and
	// no other's.
	for i := n - 1; i >= 1; i-- {
		cmds[i].Process.Signal(unix.SIGKILL)
		waitEnded(i)
		for j := 1; j < i; j++ {
			select {
			case <-ended[j]:
				t.Fatalf("process %d reported ended when %d ended", j, i)
			default:
			}
		}
	}
	w.mu.Lock()
	left := len(w.waiting)
	w.mu.Unlock()
	if left != 0 {
		t.Errorf("%d processes still watched after every exit", left)
	}
}
