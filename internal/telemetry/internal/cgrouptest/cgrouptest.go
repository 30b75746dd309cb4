// Package cgrouptest gives the telemetry tests real cgroups: a manager on a
// parent of its own that is removed with everything under it when the test
// ends, and processes started inside a group.
package cgrouptest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/internal/cgroup"
)

// RequireRoot skips tb unless it runs as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to create cgroups")
	}
}

// NewManager returns a cgroup manager on a parent "paddock-test-<rand>"
// that is emptied and removed when tb ends.
func NewManager(tb testing.TB) *cgroup.Manager {
	tb.Helper()
	RequireRoot(tb)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	m, err := cgroup.NewManager("paddock-test-"+hex.EncodeToString(b), nil)
	if err != nil {
		tb.Fatalf("creating cgroup manager: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		names, err := m.List()
		if err != nil {
			tb.Errorf("cleanup: %v", err)
		}
		for _, name := range names {
			g, err := m.Load(name)
			if err != nil {
				tb.Errorf("cleanup: %v", err)
				continue
			}
			if err := g.Kill(); err != nil {
				tb.Errorf("cleanup: %v", err)
			}
			if err := g.Delete(ctx); err != nil {
				tb.Errorf("cleanup: %v", err)
			}
		}
		if err := m.Remove(); err != nil {
			tb.Errorf("cleanup: %v", err)
		}
	})
	return m
}

// Proc is a process started in a group.
type Proc struct {
	Cmd    *exec.Cmd
	Stdout *bufio.Reader
	Stderr *bytes.Buffer
	done   chan struct{}
}

// Start runs argv inside g: a shell waits until it has been moved into the
// group, then execs argv; its stdin is at end of file by then. The
// process is killed (the group thawed first) and reaped when tb ends.
func Start(tb testing.TB, g *cgroup.Group, argv ...string) *Proc {
	tb.Helper()
	args := append([]string{"-c", `read x && exec "$@"`, "sh"}, argv...)
	p := &Proc{Cmd: exec.Command("/bin/sh", args...), Stderr: new(bytes.Buffer), done: make(chan struct{})}
	stdin, err := p.Cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatal(err)
	}
	p.Cmd.Stdout = w
	p.Cmd.Stderr = p.Stderr
	if err := p.Cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	w.Close()
	p.Stdout = bufio.NewReader(r)
	go func() {
		_ = p.Cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		_ = g.Thaw() // a frozen process would not die
		_ = p.Cmd.Process.Kill()
		<-p.done
		r.Close()
	})
	if err := g.AddProc(p.Cmd.Process.Pid); err != nil {
		tb.Fatalf("AddProc: %v", err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		tb.Fatal(err)
	}
	stdin.Close()
	return p
}

// Done is closed when the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits up to timeout for the process to exit and returns its status.
func (p *Proc) Wait(tb testing.TB, timeout time.Duration) syscall.WaitStatus {
	tb.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		tb.Fatalf("process %d still running after %v (stderr: %s)", p.Cmd.Process.Pid, timeout, p.Stderr)
	}
	return p.Cmd.ProcessState.Sys().(syscall.WaitStatus)
}

// ControlFile is the path of g's control file name ("memory.failcnt",
// "memory.pressure"), in the hierarchy that has it: on v1 the one named by
// the file's prefix ("memory." in the memory controller's), on v2 the
// unified one. "" if there is no such hierarchy mounted.
func ControlFile(g *cgroup.Group, mode cgroup.Mode, name string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	controller, _, _ := strings.Cut(name, ".")
	for line := range strings.SplitSeq(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, tail := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(tail) < 3 {
			continue
		}
		switch {
		case mode == cgroup.V2 && tail[0] == "cgroup2" && f[3] == "/":
			return f[4] + g.Path() + "/" + name
		case mode == cgroup.V1 && tail[0] == "cgroup":
			for _, opt := range strings.Split(tail[2], ",") {
				if opt == controller {
					return f[4] + g.Path() + "/" + name
				}
			}
		}
	}
	return ""
}
