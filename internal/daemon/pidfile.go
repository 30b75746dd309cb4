package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// PIDFile is the daemon's pid file in its run dir. The daemon holds a
// write lock on it while it runs, so the lock's holder, which the kernel
// reports, names the daemon of that run dir and no other: a stale file or
// a pid reused by another process is never signalled.
const PIDFile = "paddock.pid"

// holdPIDFile locks runDir's pid file and writes our pid in it; release
// removes it. A daemon already running on runDir is a conflict.
func holdPIDFile(runDir string) (release func(), err error) {
	path := filepath.Join(runDir, PIDFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk); err != nil {
		f.Close()
		if pid, _ := holder(path); pid > 0 {
			return nil, errdefs.Conflict("a paddock daemon (pid %d) already runs with run dir %s", pid, runDir)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return func() {
		// Removed while still locked: a daemon starting now finds no file
		// or makes a new one.
		os.Remove(path)
		f.Close()
	}, nil
}

// holder returns the pid of the process holding the lock on the pid file
// at path, or 0 when none does (no daemon runs).
func holder(path string) (int, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0}
	if err := unix.FcntlFlock(f.Fd(), unix.F_GETLK, &lk); err != nil {
		return 0, fmt.Errorf("asking who locks %s: %w", path, err)
	}
	if lk.Type == unix.F_UNLCK {
		return 0, nil
	}
	return int(lk.Pid), nil
}

// Stop stops the daemon whose run dir is runDir, as SIGTERM does
// (sandboxes keep running), and waits up to timeout for it to exit. It
// returns the daemon's pid, 0 when no daemon runs there.
func Stop(runDir string, timeout time.Duration) (int, error) {
	path := filepath.Join(runDir, PIDFile)
	pid, err := holder(path)
	if err != nil || pid == 0 {
		return 0, err
	}
	// A pidfd pins the process: once we hold it, checking that it still
	// holds the lock proves the signal goes to the daemon, not to a
	// process that reused its pid.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("opening pid %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	if again, err := holder(path); err != nil || again != pid {
		return 0, err
	}
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != strconv.Itoa(pid) {
		return 0, fmt.Errorf("%s names pid %s but pid %d holds it", path, strings.TrimSpace(string(b)), pid)
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGTERM, nil, 0); err != nil {
		return 0, fmt.Errorf("signalling pid %d: %w", pid, err)
	}
	// The pidfd turns readable when the process exits.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return pid, fmt.Errorf("paddock daemon (pid %d) did not exit within %v", pid, timeout)
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return pid, fmt.Errorf("waiting for pid %d: %w", pid, err)
		}
		if n > 0 {
			return pid, nil
		}
	}
}
