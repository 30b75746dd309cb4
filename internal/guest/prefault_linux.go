package guest

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// prefault maps in our own binary's pages while the guest waits for a
// sandbox, so that building and serving it does not pay a page fault for
// every code path run for the first time (tens of microseconds each on
// small VMs, where they make up most of a cold start).
func prefault() {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return
	}
	defer f.Close()
	exe, _ := os.Readlink("/proc/self/exe")
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[5] != exe && !strings.HasPrefix(fields[5], "/memfd:") {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		// Best effort: an old kernel without MADV_POPULATE_READ just
		// faults as before.
		unix.Syscall(unix.SYS_MADVISE, uintptr(start), uintptr(end-start), unix.MADV_POPULATE_READ)
	}
}

// spareThreads makes the Go runtime start n OS threads and keep them idle,
// for a guest whose threads count against its sandbox's pids limit (v2,
// gVisor; on v1 they count apart, Prepare.PidsTasks): a fork bomb that
// holds the sandbox at its cap would otherwise leave the guest unable to
// start the thread a blocking syscall needs, and the runtime aborts when
// clone fails. Idle threads are never given back, so the guest keeps
// these for its life. They cost a guest about 1.3 ms of CPU to start and
// more to end (docs/exec.md).
func spareThreads(n int) {
	var locked, release, done sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	release.Done()
	done.Wait()
}
