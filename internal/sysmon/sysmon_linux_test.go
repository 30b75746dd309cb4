package sysmon

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// TestSettle starts this test binary twice, once with Slack as its timer
// slack (as the forker starts a guest) and once with the kernel's
// default; each runs Settle, then says its own thread's slack and its
// first thread's. Either way sysmon ends with Slack and the caller with
// the default.
func TestSettle(t *testing.T) {
	if os.Getenv("SYSMON_SETTLE_CHILD") != "" {
		runtime.LockOSThread()
		if err := Settle(); err != nil {
			fmt.Println("settle:", err)
			os.Exit(1)
		}
		first, err := firstThread()
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println(slack(t, unix.Gettid()), slack(t, first))
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		t.Skip("setting another thread's timer slack needs CAP_SYS_NICE")
	}
	want := fmt.Sprint(defaultSlack.Nanoseconds(), " ", Slack.Nanoseconds())
	for _, start := range []time.Duration{Slack, defaultSlack} {
		got := make(chan string, 1)
		// A child takes the slack of the thread that forks it.
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with its slack
			if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(start.Nanoseconds()), 0, 0, 0); err != nil {
				got <- err.Error()
				return
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestSettle$")
			cmd.Env = append(os.Environ(), "SYSMON_SETTLE_CHILD=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				got <- fmt.Sprintf("%v: %s", err, out)
				return
			}
			got <- strings.TrimSpace(string(out))
		}()
		if g := <-got; g != want {
			t.Errorf("started with %v of slack: caller's and sysmon's slack %q, want %q", start, g, want)
		}
	}
}
