package guestfork

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// threadCPUs returns the CPU set of every thread of this process.
func threadCPUs(t *testing.T) map[int]unix.CPUSet {
	t.Helper()
	sets := map[int]unix.CPUSet{}
	eachThread(func(tid int) {
		var s unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &s); err == nil {
			sets[tid] = s
		}
	})
	return sets
}

// TestPinAndTakeBack: pinThreads keeps every thread on one CPU and lists
// them all; TakeBackCPUs, given that list, gives every thread all of them
// again, and refuses a list that is not one.
func TestPinAndTakeBack(t *testing.T) {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		t.Fatal(err)
	}
	if all.Count() < 2 {
		t.Skip("one CPU: nothing to pin")
	}
	t.Cleanup(func() { eachThread(func(tid int) { unix.SchedSetaffinity(tid, &all) }) })
	list := pinThreads()
	if n := strings.Count(list, ",") + 1; list == "" || n != all.Count() {
		t.Fatalf("pinThreads listed %q for %d CPUs", list, all.Count())
	}
	for tid, s := range threadCPUs(t) {
		if s.Count() != 1 {
			t.Errorf("thread %d may run on %d CPUs after pinThreads, want 1", tid, s.Count())
		}
	}
	t.Setenv(CPUsEnv, list)
	if err := TakeBackCPUs(); err != nil {
		t.Fatal(err)
	}
	for tid, s := range threadCPUs(t) {
		if s != all {
			t.Errorf("thread %d may run on %d CPUs after TakeBackCPUs, want all %d", tid, s.Count(), all.Count())
		}
	}
	for _, bad := range []string{"", "0,x", "-1", "99999"} {
		t.Setenv(CPUsEnv, bad)
		if err := TakeBackCPUs(); err == nil || !strings.Contains(err.Error(), CPUsEnv) {
			t.Errorf("TakeBackCPUs with %s=%q: %v, want an error naming it", CPUsEnv, bad, err)
		}
	}
}
