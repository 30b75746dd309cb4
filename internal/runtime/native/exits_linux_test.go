package native

import (
	"os"
	"os/exec"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/fdnotify"
)

// TestExitWatcher: the one watcher tells each process's exit to its own
// function, whichever order they end in, also for a process that ended
// before it was added, and holds no goroutine per process meanwhile.
func TestExitWatcher(t *testing.T) {
	const n = 20
	if _, err := exits(); err != nil {
		t.Fatal(err)
	}
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
		fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		pidfd := os.NewFile(uintptr(fd), "pidfd")
		ended[i] = make(chan struct{})
		done := ended[i]
		var mu sync.Mutex // holds exited until watch is set
		var watch *fdnotify.Watch
		mu.Lock()
		watch, err = watchExit(pidfd, func() {
			mu.Lock()
			watch.Stop()
			pidfd.Close()
			mu.Unlock()
			close(done)
		})
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	// None per process.
	if g := runtime.NumGoroutine() - before; g > 0 {
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
}
