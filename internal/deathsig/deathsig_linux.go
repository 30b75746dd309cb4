// Package deathsig starts child processes that die with this one.
//
// Linux sends a child's death signal (PR_SET_PDEATHSIG) when the thread
// that started it ends, not the process: a Go program's threads end
// whenever a goroutine returns while locked to one (namespace work does,
// to drop a thread it changed), and a child started from such a thread
// is killed under a live parent. Start holds a thread of its own for
// each child, from its start until it has exited.
package deathsig

import (
	"os/exec"
	"runtime"
	"syscall"
)

// Start starts cmd with SIGKILL as its death signal, from a thread kept
// until cmd has exited, and waits for it there: the returned channel is
// closed once cmd.Wait has returned (cmd.ProcessState is then set).
// cmd.Wait must not be called by anyone else.
func Start(cmd *exec.Cmd) (<-chan struct{}, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with the child
		err := cmd.Start()
		started <- err
		if err == nil {
			cmd.Wait()
		}
	}()
	if err := <-started; err != nil {
		<-done
		return nil, err
	}
	return done, nil
}
