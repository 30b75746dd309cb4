package native

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestForkerOutlivesItsStarter: the forker's death signal follows the
// thread that started it, and the daemon ends threads (a goroutine that
// returns locked to its thread: namespace work, the memory trim). A
// forker started from a thread that then ends keeps running; one that is
// killed is seen dead at once, not taken for alive while a zombie.
func TestForkerOutlivesItsStarter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the forker runs in a mount namespace of its own)")
	}
	exe, err := sealedSelf(guestBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	got := make(chan *forker, 1)
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // returns locked: this thread ends
		f, err := startForker(exe, 0)
		if err != nil {
			errc <- err
			return
		}
		got <- f
	}()
	var f *forker
	select {
	case err := <-errc:
		t.Fatal(err)
	case f = <-got:
	}
	t.Cleanup(f.close)
	// The starting goroutine's thread has ended; a death signal tied to
	// it would have come by now.
	time.Sleep(200 * time.Millisecond)
	if !f.alive() {
		t.Fatal("the forker died with the thread that started it")
	}
	f.cmd.Process.Kill()
	deadline := time.Now().Add(5 * time.Second)
	for f.alive() {
		if time.Now().After(deadline) {
			t.Fatal("a killed forker is still taken for alive")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestForkersKeepToTheirCPUs: each forker keeps all its threads on one
// CPU (guestfork's pinThreads), the next forker on the next CPU.
func TestForkersKeepToTheirCPUs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (the forker runs in a mount namespace of its own)")
	}
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if all.Count() < 2 {
		t.Skip("one CPU: nothing to pin")
	}
	exe, err := sealedSelf(guestBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	defer exe.Close()
	pinned := map[int]bool{}
	for slot := range 2 {
		f, err := startForker(exe, slot)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(f.close)
		pid := f.cmd.Process.Pid
		// It pins itself once started: wait for every thread to be on one.
		cpu := -1
		for range 500 {
			cpu = oneCPU(pid)
			if cpu >= 0 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if cpu < 0 {
			t.Fatalf("forker %d (slot %d) has threads on more than one CPU", pid, slot)
		}
		if pinned[cpu] {
			t.Fatalf("forkers of slots 0 and 1 both keep to CPU %d", cpu)
		}
		pinned[cpu] = true
	}
}

// oneCPU returns the CPU every thread of process pid keeps to, or -1 if
// they may run on more than one, or on different ones.
func oneCPU(pid int) int {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return -1
	}
	cpu := -1
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			return -1
		}
		var s unix.CPUSet
		if unix.SchedGetaffinity(tid, &s) != nil || s.Count() != 1 {
			return -1
		}
		for c := range len(s) * 64 {
			if s.IsSet(c) {
				if cpu >= 0 && cpu != c {
					return -1
				}
				cpu = c
			}
		}
	}
	return cpu
}
