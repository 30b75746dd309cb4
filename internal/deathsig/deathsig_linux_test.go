package deathsig

import (
	"os/exec"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// startFromDyingThread starts a `sleep` with start from a goroutine
// locked to its thread, which then returns: the thread ends.
func startFromDyingThread(t *testing.T, start func(*exec.Cmd) (<-chan struct{}, error)) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "30")
	type result struct {
		done <-chan struct{}
		err  error
	}
	ch := make(chan result)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends here
		done, err := start(cmd)
		ch <- result{done, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-r.done
	})
	return cmd, r.done
}

// TestOutlivesTheStartingThread: a child started by Start lives on
// after the thread its caller ran on ends; one started the plain way,
// with the same death signal, is killed (so the test can tell).
func TestOutlivesTheStartingThread(t *testing.T) {
	plain := func(cmd *exec.Cmd) (<-chan struct{}, error) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		return done, nil
	}
	// A goroutine that lands on the main thread cannot end it (the
	// runtime parks that thread instead): a few tries.
	killed := false
	for try := 0; try < 5 && !killed; try++ {
		cmd, done := startFromDyingThread(t, plain)
		select {
		case <-done:
			if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("the plain child ended with %v, want killed by SIGKILL", cmd.ProcessState)
			}
			killed = true
		case <-time.After(time.Second):
		}
	}
	if !killed {
		t.Fatal("the plain child outlived its starting thread five times: this kernel does not show what Start guards against")
	}

	cmd, done := startFromDyingThread(t, Start)
	select {
	case <-done:
		t.Fatalf("the child of Start ended with its caller's thread: %v", cmd.ProcessState)
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("done was not closed after the child exited")
	}
}
