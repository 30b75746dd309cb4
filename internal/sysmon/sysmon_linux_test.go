package sysmon

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func slack(t *testing.T, tid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/timerslack_ns")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestCalm: the runtime's first thread gets the slack, no other thread's
// changes.
func TestCalm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting another thread's timer slack needs CAP_SYS_NICE")
	}
	first, err := firstThread()
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	before := map[int]string{}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(task.Name())
		if tid != first {
			before[tid] = slack(t, tid)
		}
	}
	if len(before) == 0 {
		t.Fatal("the test process has only one thread")
	}
	if err := Calm(); err != nil {
		t.Fatal(err)
	}
	if got, want := slack(t, first), strconv.FormatInt(Slack.Nanoseconds(), 10); got != want {
		t.Errorf("first thread %d: slack %s ns, want %s", first, got, want)
	}
	for tid, was := range before {
		if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid)); err != nil {
			continue // exited meanwhile
		}
		if got := slack(t, tid); got != was {
			t.Errorf("thread %d: slack %s ns, was %s", tid, got, was)
		}
	}
	if pid := os.Getpid(); first <= pid {
		t.Errorf("first thread %d is not above the process %d", first, pid)
	}
}
