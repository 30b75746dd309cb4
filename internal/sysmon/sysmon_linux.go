// Package sysmon calms the Go runtime's monitor thread (sysmon) of a
// process that waits for work most of the time and then does a short
// burst of it: the daemon, and the guest in each sandbox.
//
// When every P of such a process has been idle, sysmon sleeps until the
// next timer; the first system call after that wakes it, and it then
// sleeps 20 µs at a time (plus the thread's timer slack, 50 µs by default)
// until the process is idle again. Around one exec of `true` that was
// about nine wakes of sysmon in the guest and four in the daemon, each a
// thread wake on one of the vCPUs the exec's own work needs; on a virtual
// machine a wake costs 40-100 µs. With a 2 ms slack sysmon wakes about
// three times per exec in the guest, and the exec round trip was 70-100 µs
// faster for the guest's and 40-80 µs for the daemon's (alternating blocks
// against the same build without it; docs/exec.md).
//
// What sysmon does is not urgent at that scale: it takes a P back from a
// thread blocked in a system call (up to 2 ms later now; file transfers
// alongside short execs measured no slower) and preempts a goroutine that
// ran 10 ms. Threads inherit the slack of the thread that starts them, so
// the threads sysmon starts (for a P it takes back) have the same slack:
// their timers may fire up to 2 ms late. A process that forks work whose
// timers matter sets its forking thread's slack itself (the guest's
// spawner does). A process can also start with the slack (the forker
// gives it to every guest before exec) and Settle.
package sysmon

import (
	"errors"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Slack is the timer slack Calm gives sysmon.
const Slack = 2 * time.Millisecond

// Calm gives the runtime's monitor thread Slack. It is the first thread
// the runtime starts, before any of the program's code runs: the thread
// with the lowest id above the process's (as /proc names them; only a
// wrap of the PID space between the process's start and its first thread
// would break that, and then Calm slows some other thread's timers by
// 2 ms). Writing another thread's slack needs CAP_SYS_NICE.
func Calm() error {
	tid, err := firstThread()
	if err != nil {
		return err
	}
	return os.WriteFile("/proc/"+strconv.Itoa(tid)+"/timerslack_ns", []byte(strconv.FormatInt(Slack.Nanoseconds(), 10)), 0)
}

// firstThread returns the lowest thread id above the process's.
func firstThread() (int, error) {
	self, err := os.Readlink("/proc/self")
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(self)
	if err != nil {
		return 0, err
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, err
	}
	first := 0
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err == nil && tid > pid && (first == 0 || tid < first) {
			first = tid
		}
	}
	if first == 0 {
		return 0, errors.New("no thread started after the main one")
	}
	return first, nil
}

// defaultSlack is the kernel's timer slack for a normal thread.
const defaultSlack = 50 * time.Microsecond

// Settle calms sysmon, or finds it calm already: a process started with
// Slack (the forker gives every guest it before exec) passed it to
// sysmon, the first thread its runtime started, and then Settle only
// gives the calling thread (the main one, before it starts others) the
// kernel's default back, so that the threads it starts and their timers
// are as usual. Otherwise it is Calm.
func Settle() error {
	slack, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil || time.Duration(slack) < Slack {
		return Calm()
	}
	return unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(defaultSlack.Nanoseconds()), 0, 0, 0)
}
