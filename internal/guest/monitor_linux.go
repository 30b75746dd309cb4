package guest

import (
	"bufio"
	"errors"
	"os"
	"strconv"
	"strings"
	"time"
)

// monitorSlack is the timer slack given to the Go runtime's monitor
// thread (sysmon). Whenever the guest wakes after an idle spell its first
// system call wakes sysmon, which then sleeps 20 µs at a time (plus the
// default 50 µs slack) until the guest is idle again: nine wakes of a
// thread per exec of `true`, each a vCPU wake on a virtual machine, on the
// path of the exec or of the command it runs. With this slack sysmon
// wakes about three times per exec and the round trip is 70-100 µs
// faster (docs/ARCHITECTURE.md). What sysmon does is not urgent at this
// scale: taking the P back from a system call that blocks, with one P in
// the guest, comes up to 2 ms later (concurrent file transfers measured
// no slower); preempting a goroutine that runs long happens after 10 ms.
const monitorSlack = 2 * time.Millisecond

// slowMonitor gives sysmon monitorSlack. It is the first thread the
// runtime starts, before any code of ours runs: thread 2 in the guest's
// PID namespace, whose process 1 the guest is. Threads inherit the slack
// of the thread that starts them; those sysmon starts (for a P it takes
// back) get it too, which only makes their timers up to 2 ms late. The
// processes of the sandbox are forked by the spawner thread, which the
// main thread started, so they keep the kernel's default.
func slowMonitor() error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if nsTID(t.Name()) == 2 {
			// Named as this /proc names it (the host's, at this point).
			slack := strconv.FormatInt(monitorSlack.Nanoseconds(), 10)
			return os.WriteFile("/proc/"+t.Name()+"/timerslack_ns", []byte(slack), 0)
		}
	}
	return errors.New("no thread 2 in the guest's PID namespace")
}

// nsTID is a thread's id in its innermost PID namespace, or -1.
func nsTID(tid string) int {
	f, err := os.Open("/proc/self/task/" + tid + "/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "NSpid:")
		if !ok {
			continue
		}
		ids := strings.Fields(rest)
		if len(ids) == 0 {
			return -1
		}
		n, err := strconv.Atoi(ids[len(ids)-1])
		if err != nil {
			return -1
		}
		return n
	}
	return -1
}
