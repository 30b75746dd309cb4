// Package reaper reaps a process's exited children as SIGCHLD reports
// them.
package reaper

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// Watch asks for SIGCHLD from now on and returns the channel Run reaps
// from. It is apart from Run so that a process that serves later can ask
// early: each signal.Notify is a round trip with the Go runtime's
// signal-mask thread, two thread wakes.
func Watch() <-chan os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGCHLD)
	return ch
}

// Run reaps every exited child each time SIGCHLD arrives on sigchld (from
// Watch), passing each to exited (if set). It never returns.
func Run(sigchld <-chan os.Signal, exited func(pid int, ws unix.WaitStatus)) {
	for range sigchld {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			if exited != nil {
				exited(pid, ws)
			}
		}
	}
}
