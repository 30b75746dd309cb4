package cgroup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

// cgroupOf is the group of a task in controller's v1 hierarchy, from its
// /proc/.../cgroup file.
func cgroupOf(t *testing.T, procFile, controller string) string {
	t.Helper()
	b, err := os.ReadFile(procFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) == 3 && strings.Contains(","+f[1]+",", ","+controller+",") {
			return f[2]
		}
	}
	t.Fatalf("%s names no %s group:\n%s", procFile, controller, b)
	return ""
}

// TestPidsApart: on v1 a process can sit in a sandbox's group for every
// controller but pids, and a thread of it can join the group's pids
// group alone through a tasks file the manager opened.
func TestPidsApart(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		var l Limits
		if m.Mode() == V1 {
			l.Pids = 5
		}
		g := createGroup(t, m, "apart", l)
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		pid := cmd.Process.Pid
		if m.Mode() == V2 {
			if err := m.AddToParentPids(pid); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("AddToParentPids on v2 = %v, want ErrUnavailable", err)
			}
			if err := g.AddProcButPids(pid); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("AddProcButPids on v2 = %v, want ErrUnavailable", err)
			}
			if _, err := g.OpenPidsTasks(); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Errorf("OpenPidsTasks on v2 = %v, want ErrUnavailable", err)
			}
			return
		}
		if err := m.AddToParentPids(pid); err != nil {
			t.Fatalf("AddToParentPids: %v", err)
		}
		if err := g.AddProcButPids(pid); err != nil {
			t.Fatalf("AddProcButPids: %v", err)
		}
		file := fmt.Sprintf("/proc/%d/cgroup", pid)
		if got := cgroupOf(t, file, "pids"); got != m.parent {
			t.Errorf("pids group %q, want the parent %q", got, m.parent)
		}
		for _, c := range []string{"memory", "cpu", "freezer"} {
			if got := cgroupOf(t, file, c); got != g.Path() {
				t.Errorf("%s group %q, want %q", c, got, g.Path())
			}
		}
		if s := stats(t, g); s.PidsCurrent != 0 {
			t.Errorf("the group's pids.current is %d with the process apart, want 0", s.PidsCurrent)
		}
		// A thread of this test joins the group's pids group by writing
		// "0"; the process's other threads stay where they are.
		tasks, err := g.OpenPidsTasks()
		if err != nil {
			t.Fatalf("OpenPidsTasks: %v", err)
		}
		defer tasks.Close()
		before := cgroupOf(t, "/proc/self/cgroup", "pids")
		type joined struct {
			group string
			err   error
		}
		ch := make(chan *joined)
		var j *joined
		for j == nil {
			go func() {
				runtime.LockOSThread()
				if unix.Gettid() == unix.Getpid() {
					// The main thread, which outlives any goroutine
					// locked to it: try again on another.
					runtime.UnlockOSThread()
					ch <- nil
					return
				}
				// Never unlocked: the thread ends with the goroutine,
				// and leaves the group with it.
				_, err := tasks.Write([]byte("0"))
				ch <- &joined{cgroupOf(t, "/proc/thread-self/cgroup", "pids"), err}
			}()
			j = <-ch
		}
		if j.err != nil {
			t.Fatalf("writing 0 to the tasks file: %v", j.err)
		}
		if j.group != g.Path() {
			t.Errorf("the writing thread's pids group is %q, want %q", j.group, g.Path())
		}
		if got := cgroupOf(t, "/proc/self/cgroup", "pids"); got != before {
			t.Errorf("the process's main thread moved to %q, want it left in %q", got, before)
		}
		// The thread has ended, or is about to: wait until it has left,
		// or the cleanup's kill of the group would find this process.
		v1, _ := g.pidsApart()
		deadline := time.Now().Add(5 * time.Second)
		for {
			b, err := os.ReadFile(v1.pids + "/tasks")
			if err == nil && len(strings.TrimSpace(string(b))) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the joined thread is still in the group: %q %v", b, err)
			}
			time.Sleep(time.Millisecond)
		}
	})
}
