// Package reaper reaps a process's exited children as SIGCHLD reports
// them.
package reaper

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// Run reaps every exited child each time SIGCHLD arrives, passing each to
// exited (if set). It never returns.
func Run(exited func(pid int, ws unix.WaitStatus)) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGCHLD)
	for range ch {
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
