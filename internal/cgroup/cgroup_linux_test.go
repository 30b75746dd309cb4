package cgroup

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/internal/errdefs"
)

const python = "/usr/bin/python3"

func TestMain(m *testing.M) {
	// Processes orphaned by a killed parent in a test group are reparented
	// to the test binary, which reaps them (reapOrphans), instead of to a
	// PID 1 that may never reap them.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	os.Exit(m.Run())
}

func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root to create cgroups")
	}
}

func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func uniqueParent(tb testing.TB) string {
	tb.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return "paddock-test-" + hex.EncodeToString(b)
}

// newTestManager makes a manager with a parent of its own on the host's
// hierarchies (h == nil) or on h, and removes every group it leaves behind,
// even when the test fails.
func newTestManager(tb testing.TB, h hierarchy) *Manager {
	tb.Helper()
	requireRoot(tb)
	var (
		m   *Manager
		err error
	)
	if h == nil {
		m, err = NewManager(uniqueParent(tb), testLogger(tb))
	} else {
		m, err = newManager(uniqueParent(tb), h, testLogger(tb))
	}
	if err != nil {
		tb.Fatalf("creating manager: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
		reapOrphans(tb)
	})
	return m
}

// reapOrphans reaps the exited processes that were reparented to the test
// binary. Every process a test started itself has been waited for by then.
func reapOrphans(tb testing.TB) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		switch {
		case err == unix.ECHILD:
			return
		case err != nil && err != unix.EINTR:
			tb.Logf("reaping orphans: %v", err)
			return
		case pid == 0:
			time.Sleep(time.Millisecond)
		}
	}
	tb.Logf("reaping orphans: children still running after 2s")
}

// hierarchyCase is one hierarchy the tests that need no controllers run on.
type hierarchyCase struct {
	name string
	h    func() hierarchy // nil: the host's own, through NewManager
}

// hierarchies are the host's own hierarchies and, on a hybrid host, its
// cgroup2 mount driven as V2 (without controllers: create, processes,
// freeze, kill and delete work there, limits do not).
func hierarchies(tb testing.TB) []hierarchyCase {
	tb.Helper()
	cases := []hierarchyCase{{name: "host"}}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		tb.Fatal(err)
	}
	mounts := parseMountinfo(b)
	if mounts.v2 != "" && len(mounts.v1) > 0 {
		cases = append(cases, hierarchyCase{
			name: "v2-without-controllers",
			h:    func() hierarchy { return newV2Hierarchy(mounts.v2, false) },
		})
	}
	return cases
}

func forEachHierarchy(t *testing.T, f func(t *testing.T, m *Manager)) {
	for _, hc := range hierarchies(t) {
		t.Run(hc.name, func(t *testing.T) {
			var h hierarchy
			if hc.h != nil {
				h = hc.h()
			}
			f(t, newTestManager(t, h))
		})
	}
}

// hostLimits are the limits a group on hierarchy m can take: none where
// the controllers are missing.
func hostLimits(m *Manager, l Limits) Limits {
	if v2, ok := m.h.(*v2Hierarchy); ok && v2.ctrl != allControllers {
		return Limits{}
	}
	return l
}

func requireControllers(t *testing.T, m *Manager) {
	t.Helper()
	if v2, ok := m.h.(*v2Hierarchy); ok && v2.ctrl != allControllers {
		t.Skipf("cgroup v2 controllers %s are not enabled", allControllers&^v2.ctrl)
	}
}

func createGroup(t *testing.T, m *Manager, name string, l Limits) *Group {
	t.Helper()
	g, err := m.Create(name, l)
	if err != nil {
		t.Fatalf("Create(%q): %v", name, err)
	}
	return g
}

// proc is a process a test started in a group.
type proc struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	stderr bytes.Buffer
	done   chan struct{}
	err    error // from Wait, once done is closed
}

// startInGroup starts argv in g: a shell holds it until it is in the group,
// then execs it. The process is killed and reaped when the test ends.
func startInGroup(t *testing.T, g *Group, argv ...string) *proc {
	t.Helper()
	args := append([]string{"-c", `read x && exec "$@"`, "sh"}, argv...)
	p := &proc{cmd: exec.Command("/bin/sh", args...), done: make(chan struct{})}
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = w
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	p.stdout = bufio.NewReader(r)
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		r.Close()
	})
	if err := g.AddProc(p.cmd.Process.Pid); err != nil {
		t.Fatalf("AddProc: %v", err)
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	return p
}

// wait waits for p to exit and returns its wait status.
func (p *proc) wait(t *testing.T, timeout time.Duration) syscall.WaitStatus {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("process %d still running after %v", p.cmd.Process.Pid, timeout)
	}
	return p.cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func (p *proc) readLine(t *testing.T) string {
	t.Helper()
	line, err := p.stdout.ReadString('\n')
	if err != nil {
		t.Fatalf("reading from process: %v (stderr: %s)", err, p.stderr.String())
	}
	return strings.TrimSpace(line)
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func pids(t *testing.T, g *Group) []int {
	t.Helper()
	p, err := g.Pids()
	if err != nil {
		t.Fatalf("Pids: %v", err)
	}
	return p
}

func stats(t *testing.T, g *Group) Stats {
	t.Helper()
	s, err := g.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return s
}

// cpuShare is the fraction of one core g used over window.
func cpuShare(t *testing.T, g *Group, window time.Duration) float64 {
	t.Helper()
	return cpuShares(t, window, g)[0]
}

// cpuShares is cpuShare of each group, over one window.
func cpuShares(t *testing.T, window time.Duration, gs ...*Group) []float64 {
	t.Helper()
	before := make([]uint64, len(gs))
	for i, g := range gs {
		before[i] = stats(t, g).CPUUsageNanos
	}
	start := time.Now()
	time.Sleep(window)
	wall := time.Since(start)
	shares := make([]float64, len(gs))
	for i, g := range gs {
		shares[i] = float64(stats(t, g).CPUUsageNanos-before[i]) / float64(wall)
	}
	return shares
}

func TestNewManagerRefusesBadParent(t *testing.T) {
	for _, parent := range []string{"", "/paddock", "../paddock", "a//b", "pad dock"} {
		if _, err := NewManager(parent, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("NewManager(%q) = %v, want ErrInvalid", parent, err)
		}
	}
}

func TestNewManager(t *testing.T) {
	m := newTestManager(t, nil)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	want := V1
	if len(parseMountinfo(b).v1) == 0 {
		want = V2
	}
	if m.Mode() != want {
		t.Errorf("Mode() = %v, want %v", m.Mode(), want)
	}
	for _, d := range m.h.group(m.parent).dirs() {
		if !exists(d) {
			t.Errorf("parent %s was not created", d)
		}
	}
	// A second manager on the same parent (a daemon restart) is fine.
	if _, err := newManager(strings.TrimPrefix(m.parent, "/"), m.h, nil); err != nil {
		t.Errorf("second manager on %s: %v", m.parent, err)
	}
}

func TestLifecycle(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		l := hostLimits(m, Limits{CPUs: 1, MemoryBytes: 128 << 20, Pids: 100})
		a := createGroup(t, m, "a", l)
		createGroup(t, m, "b-2", Limits{})

		if a.Name() != "a" || a.Path() != m.parent+"/a" {
			t.Errorf("Name, Path = %q, %q; want a, %s/a", a.Name(), a.Path(), m.parent)
		}
		if _, err := m.Create("a", l); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("Create of an existing group = %v, want ErrConflict", err)
		}
		for _, bad := range []string{"", "A", "../x", strings.Repeat("x", 65)} {
			if _, err := m.Create(bad, Limits{}); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Create(%q) = %v, want ErrInvalid", bad, err)
			}
		}
		if _, err := m.Create("c", Limits{Pids: -1}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Create with bad limits = %v, want ErrInvalid", err)
		}

		got, err := m.List()
		if err != nil || !slices.Equal(got, []string{"a", "b-2"}) {
			t.Errorf("List() = %v, %v; want [a b-2]", got, err)
		}
		loaded, err := m.Load("a")
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		if loaded.Path() != a.Path() {
			t.Errorf("loaded Path = %q, want %q", loaded.Path(), a.Path())
		}
		if _, err := m.Load("missing"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Load(missing) = %v, want ErrNotFound", err)
		}
		if err := m.Remove(); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("Remove with children = %v, want ErrConflict", err)
		}

		ctx := context.Background()
		if err := loaded.Delete(ctx); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		if err := a.Delete(ctx); err != nil {
			t.Errorf("Delete of a deleted group = %v, want nil", err)
		}
		for _, d := range a.d.dirs() {
			if exists(d) {
				t.Errorf("%s still exists", d)
			}
		}
		if _, err := m.Load("a"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Load after Delete = %v, want ErrNotFound", err)
		}
		if _, err := a.Stats(); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Stats after Delete = %v, want ErrNotFound", err)
		}
		if err := a.Kill(); err != nil {
			t.Errorf("Kill after Delete = %v, want nil", err)
		}
		if got, err := m.List(); err != nil || !slices.Equal(got, []string{"b-2"}) {
			t.Errorf("List() = %v, %v; want [b-2]", got, err)
		}
		// The name is free again.
		createGroup(t, m, "a", l)
	})
}

func TestCreateLeavesNothingOnFailure(t *testing.T) {
	m := newTestManager(t, nil)
	if m.Mode() != V1 {
		t.Skip("a half-made group can only be faked on v1's several hierarchies")
	}
	// A group a crash left in one hierarchy only: Create must refuse it and
	// not delete what it did not make; Load and Delete must handle it.
	v1 := m.h.group(m.parent + "/half").(*v1Group)
	if err := os.Mkdir(v1.pids, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create("half", Limits{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Create over a half-made group = %v, want ErrConflict", err)
	}
	for _, d := range v1.all {
		if exists(d) != (d == v1.pids) {
			t.Errorf("%s exists = %v after the failed Create", d, exists(d))
		}
	}
	if got, _ := m.List(); !slices.Equal(got, []string{"half"}) {
		t.Errorf("List() = %v, want [half]", got)
	}
	g, err := m.Load("half")
	if err != nil {
		t.Fatalf("Load of a half-made group: %v", err)
	}
	if err := g.Delete(context.Background()); err != nil {
		t.Fatalf("Delete of a half-made group: %v", err)
	}
	if exists(v1.pids) {
		t.Errorf("%s still exists", v1.pids)
	}
}

func TestAddProcAndKill(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		for _, frozen := range []bool{false, true} {
			t.Run(fmt.Sprintf("frozen=%v", frozen), func(t *testing.T) {
				name := "kill"
				if frozen {
					name = "kill-frozen"
				}
				g := createGroup(t, m, name, Limits{})
				// A shell with two children of its own: Kill must get all three.
				p := startInGroup(t, g, "/bin/sh", "-c", "sleep 60 & sleep 60 & echo started; wait")
				if line := p.readLine(t); line != "started" {
					t.Fatalf("process said %q", line)
				}
				got := pids(t, g)
				if len(got) != 3 || !slices.Contains(got, p.cmd.Process.Pid) {
					t.Fatalf("Pids() = %v, want the shell %d and its two sleeps", got, p.cmd.Process.Pid)
				}
				if frozen {
					if err := g.Freeze(context.Background()); err != nil {
						t.Fatalf("Freeze: %v", err)
					}
				}
				if err := g.Kill(); err != nil {
					t.Fatalf("Kill: %v", err)
				}
				// Delete at once, while the processes may still be exiting.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := g.Delete(ctx); err != nil {
					t.Fatalf("Delete right after Kill: %v", err)
				}
				if ws := p.wait(t, 5*time.Second); ws.Signal() != syscall.SIGKILL {
					t.Errorf("shell ended with %v, want SIGKILL", ws)
				}
				if got := pids(t, g); len(got) != 0 {
					t.Errorf("Pids() after Kill and Delete = %v", got)
				}
			})
		}
	})
}

func TestKillEmptiesGroup(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "k", Limits{})
		p := startInGroup(t, g, "/bin/sh", "-c", "sleep 60 & echo started; wait")
		p.readLine(t)
		if err := g.Kill(); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		waitFor(t, 5*time.Second, "an empty group", func() bool { return len(pids(t, g)) == 0 })
		p.wait(t, 5*time.Second)
	})
}

func TestKillEachWithoutGroupKill(t *testing.T) {
	// v1's way, forced on every hierarchy (on v2 it stands in for kernels
	// before 5.14): freeze, signal each, thaw, until empty. A shell that
	// keeps forking must not outrun it.
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "each", Limits{})
		p := startInGroup(t, g, "/bin/sh", "-c", "echo started; i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); done; wait")
		p.readLine(t)
		if err := g.killEach(); err != nil {
			t.Fatalf("killEach: %v", err)
		}
		if got := pids(t, g); len(got) != 0 {
			t.Fatalf("Pids() after killEach = %v", got)
		}
		p.wait(t, 5*time.Second)
	})
}

func TestAddProcErrors(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "procs", Limits{})
		if err := g.AddProc(1<<22 - 1); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("AddProc of a missing process = %v, want ErrNotFound", err)
		}
		if err := g.AddProc(0); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("AddProc(0) = %v, want ErrInvalid", err)
		}
	})
}

func TestSubgroupsAreListedKilledAndDeleted(t *testing.T) {
	// A sandbox's containers may get groups of their own below it.
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "nested", Limits{})
		for _, d := range g.d.dirs() {
			if err := os.Mkdir(d+"/inner", 0o755); err != nil {
				t.Fatal(err)
			}
		}
		inner := &Group{name: "inner", rel: g.rel + "/inner", d: m.h.group(g.rel + "/inner"), log: m.log}
		p := startInGroup(t, inner, "sleep", "60")
		if got := pids(t, g); !slices.Equal(got, []int{p.cmd.Process.Pid}) {
			t.Fatalf("Pids() = %v, want [%d] from the subgroup", got, p.cmd.Process.Pid)
		}
		if err := g.Kill(); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.Delete(ctx); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		p.wait(t, 5*time.Second)
	})
}

func TestDeleteWaitsForContext(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "busy", Limits{})
		startInGroup(t, g, "sleep", "60")
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := g.Delete(ctx)
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, unix.EBUSY) {
			t.Fatalf("Delete of a group in use = %v, want the deadline and EBUSY", err)
		}
	})
}

func TestDeleteIfEmpty(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "maybe", Limits{})
		p := startInGroup(t, g, "sleep", "60")
		gone, err := g.DeleteIfEmpty()
		if err != nil || gone {
			t.Fatalf("DeleteIfEmpty of a group in use = %v, %v; want false, nil", gone, err)
		}
		if got := pids(t, g); !slices.Equal(got, []int{p.cmd.Process.Pid}) {
			t.Fatalf("Pids() after a refused DeleteIfEmpty = %v, want [%d]", got, p.cmd.Process.Pid)
		}
		if err := g.Kill(); err != nil {
			t.Fatalf("Kill: %v", err)
		}
		p.wait(t, 5*time.Second)
		waitFor(t, 5*time.Second, "the group removed", func() bool {
			gone, err := g.DeleteIfEmpty()
			if err != nil {
				t.Fatalf("DeleteIfEmpty of an emptied group: %v", err)
			}
			return gone
		})
		for _, d := range g.d.dirs() {
			if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s after DeleteIfEmpty: %v, want it gone", d, err)
			}
		}
		if gone, err := g.DeleteIfEmpty(); !gone || err != nil {
			t.Errorf("DeleteIfEmpty of a removed group = %v, %v; want true, nil", gone, err)
		}
	})
}

func TestFreezeThaw(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "freeze", Limits{})
		startInGroup(t, g, "/bin/sh", "-c", "while :; do :; done")
		waitFor(t, 5*time.Second, "the loop to run", func() bool { return stats(t, g).CPUUsageNanos > 0 })

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := g.Freeze(ctx); err != nil {
			t.Fatalf("Freeze: %v", err)
		}
		if share := cpuShare(t, g, 300*time.Millisecond); share > 0.02 {
			t.Errorf("a frozen group used %.3f of a core", share)
		}
		if err := g.Thaw(); err != nil {
			t.Fatalf("Thaw: %v", err)
		}
		// It runs again: by how much is the host's load to say, so
		// only that it gets CPU time is checked.
		thawed := stats(t, g).CPUUsageNanos
		waitFor(t, 10*time.Second, "the thawed loop to run", func() bool {
			return stats(t, g).CPUUsageNanos > thawed+uint64(20*time.Millisecond)
		})
	})
}

func TestMemoryLimitOOMKills(t *testing.T) {
	m := newTestManager(t, nil)
	requireControllers(t, m)
	g := createGroup(t, m, "oom", Limits{MemoryBytes: 64 << 20})

	p := startInGroup(t, g, python, "-c", "x = b'\\x01' * (300 << 20); print('survived')")
	ws := p.wait(t, 30*time.Second)
	if ws.Signal() != syscall.SIGKILL {
		t.Fatalf("allocating 300 MiB in 64 MiB ended with %v (stderr %q), want SIGKILL", ws, p.stderr.String())
	}
	s := stats(t, g)
	if s.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want at least 1", s.OOMKills)
	}
	if s.MemoryLimit != 64<<20 {
		t.Errorf("MemoryLimit = %d, want %d", s.MemoryLimit, 64<<20)
	}
	if s.MemoryPeak <= 0 || s.MemoryPeak > 64<<20 {
		t.Errorf("MemoryPeak = %d, want within (0, 64 MiB]", s.MemoryPeak)
	}

	f, err := g.OpenOOMEvents()
	if err != nil {
		t.Fatalf("OpenOOMEvents: %v", err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := ParseOOMKills(b); err != nil || n != s.OOMKills {
		t.Errorf("ParseOOMKills(%q) = %d, %v; want %d", b, n, err, s.OOMKills)
	}
	// The test process, outside the group, lives on: a second OOM in the
	// group only adds to the group's count.
	p = startInGroup(t, g, python, "-c", "x = b'\\x01' * (300 << 20)")
	p.wait(t, 30*time.Second)
	if got := stats(t, g).OOMKills; got < s.OOMKills+1 {
		t.Errorf("OOMKills after a second OOM = %d, want at least %d", got, s.OOMKills+1)
	}
}

func TestPidsLimitStopsForks(t *testing.T) {
	m := newTestManager(t, nil)
	requireControllers(t, m)
	g := createGroup(t, m, "pids", Limits{Pids: 20})

	// At most 100 forks; the children sleep until the parent, on the first
	// failed fork, kills and reaps them.
	const script = `
import os, sys, time
kids, errno = [], 0
for _ in range(100):
    try:
        pid = os.fork()
    except OSError as e:
        errno = e.errno
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print(len(kids), errno, flush=True)
for k in kids:
    os.kill(k, 9)
for k in kids:
    os.waitpid(k, 0)
`
	p := startInGroup(t, g, python, "-c", script)
	var kids, errno int
	if _, err := fmt.Sscan(p.readLine(t), &kids, &errno); err != nil {
		t.Fatal(err)
	}
	if errno != int(unix.EAGAIN) || kids >= 20 {
		t.Errorf("forked %d children, then errno %d; want fewer than 20, then EAGAIN", kids, errno)
	}
	s := stats(t, g)
	if s.PidsLimit != 20 || s.PidsCurrent > 20 {
		t.Errorf("PidsLimit, PidsCurrent = %d, %d; want 20, at most 20", s.PidsLimit, s.PidsCurrent)
	}
	if ws := p.wait(t, 10*time.Second); ws.ExitStatus() != 0 {
		t.Errorf("fork loop exited with %v (stderr %q)", ws, p.stderr.String())
	}
}

func TestCPULimit(t *testing.T) {
	tests := []struct {
		name   string
		create Limits
		update *Limits
	}{
		{name: "at create", create: Limits{CPUs: 0.5}},
		{name: "by update", create: Limits{}, update: &Limits{CPUs: 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newTestManager(t, nil)
			requireControllers(t, m)
			g := createGroup(t, m, "cpu", tt.create)
			startInGroup(t, g, "/bin/sh", "-c", "while :; do :; done")
			// The same loop without a quota, measured in the same
			// windows: what this host's load leaves a loop.
			ref := createGroup(t, m, "ref", Limits{})
			startInGroup(t, ref, "/bin/sh", "-c", "while :; do :; done")
			if tt.update != nil {
				time.Sleep(100 * time.Millisecond)
				if err := g.Update(*tt.update); err != nil {
					t.Fatalf("Update: %v", err)
				}
			}
			time.Sleep(300 * time.Millisecond) // past any burst of the first period

			// The quota caps the share, so too much is a failure at once; too
			// little can be other load on this host's two cores, so that is
			// measured again before it fails, and judged only when the loop
			// without a quota got most of a core meanwhile.
			var share, free float64
			for range 3 {
				shares := cpuShares(t, 1500*time.Millisecond, g, ref)
				share, free = shares[0], shares[1]
				if share > 0.7 {
					t.Fatalf("a busy loop limited to 0.5 CPUs used %.3f of a core", share)
				}
				if share >= 0.3 {
					break
				}
			}
			switch {
			case share < 0.3 && free >= 0.6:
				t.Fatalf("a busy loop limited to 0.5 CPUs used only %.3f of a core, one without a quota %.3f", share, free)
			case share < 0.3:
				// Nor whether it was throttled: it never reached its quota.
				t.Logf("the host is too busy to judge the lower bound: a loop without a quota got %.3f of a core", free)
			default:
				if s := stats(t, g); s.CPUThrottledNanos == 0 {
					t.Errorf("CPUThrottledNanos = 0 for a throttled loop")
				}
			}
			t.Logf("share of a core: %.3f", share)
		})
	}
}

// cpuQuota reads the group's quota back from its control file.
func cpuQuota(t *testing.T, g *Group) string {
	t.Helper()
	return cpuFile(t, g, "cpu.cfs_quota_us", "cpu.max")
}

// cpuFile reads the group's CPU control file named v1 or v2.
func cpuFile(t *testing.T, g *Group, v1, v2 string) string {
	t.Helper()
	var path string
	switch d := g.d.(type) {
	case *v1Group:
		path = d.cpu + "/" + v1
	case *v2Group:
		path = d.path + "/" + v2
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestUpdate(t *testing.T) {
	m := newTestManager(t, nil)
	requireControllers(t, m)
	g := createGroup(t, m, "update", Limits{CPUs: 1, MemoryBytes: 128 << 20, Pids: 50})
	quota := func(v1, v2 string) string {
		if m.Mode() == V1 {
			return v1
		}
		return v2
	}

	steps := []struct {
		name  string
		l     Limits
		quota string
	}{
		{"raise memory, lower cpu and pids", Limits{CPUs: 0.25, MemoryBytes: 256 << 20, Pids: 10}, quota("25000", "25000 100000")},
		{"lower memory, raise cpu", Limits{CPUs: 2, MemoryBytes: 32 << 20, Pids: 10}, quota("200000", "200000 100000")},
		{"unlimited", Limits{}, quota("-1", "max 100000")},
		{"limited again", Limits{CPUs: 0.5, MemoryBytes: 96 << 20, Pids: 30}, quota("50000", "50000 100000")},
	}
	for _, st := range steps {
		if err := g.Update(st.l); err != nil {
			t.Fatalf("%s: Update: %v", st.name, err)
		}
		s := stats(t, g)
		if s.MemoryLimit != st.l.MemoryBytes || s.PidsLimit != st.l.Pids {
			t.Errorf("%s: MemoryLimit, PidsLimit = %d, %d; want %d, %d", st.name, s.MemoryLimit, s.PidsLimit, st.l.MemoryBytes, st.l.Pids)
		}
		if got := cpuQuota(t, g); got != st.quota {
			t.Errorf("%s: cpu quota = %q, want %q", st.name, got, st.quota)
		}
		if v1, ok := g.d.(*v1Group); ok && v1.memsw {
			b, _ := os.ReadFile(v1.memory + "/memory.memsw.limit_in_bytes")
			if n, _ := parseLimit(b); n != st.l.MemoryBytes {
				t.Errorf("%s: memsw limit = %d, want %d (no swap)", st.name, n, st.l.MemoryBytes)
			}
		}
	}
	if err := g.Update(Limits{Pids: -3}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Update with bad limits = %v, want ErrInvalid", err)
	}

	// Lowering memory below what a process holds (and no swap to push it
	// to) must fail clearly, not kill it, and leave the old limit.
	p := startInGroup(t, g, python, "-c", "import time; x = b'\\x01' * (40 << 20); print('ready', flush=True); time.sleep(60)")
	if line := p.readLine(t); line != "ready" {
		t.Fatalf("process said %q", line)
	}
	err := g.Update(Limits{CPUs: 0.5, MemoryBytes: 16 << 20, Pids: 30})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Update below usage = %v, want ErrConflict", err)
	}
	t.Logf("Update below usage: %v", err)
	if s := stats(t, g); s.MemoryLimit != 96<<20 || s.OOMKills != 0 {
		t.Errorf("after the refused update: MemoryLimit %d, OOMKills %d; want %d, 0", s.MemoryLimit, s.OOMKills, 96<<20)
	}
	select {
	case <-p.done:
		t.Fatalf("the process died: %v", p.err)
	default:
	}
	if err := g.Update(Limits{MemoryBytes: 128 << 20}); err != nil {
		t.Fatalf("Update above usage: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := g.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Update(Limits{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Update of a deleted group = %v, want ErrNotFound", err)
	}
}

func TestOpenDirFD(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "fd", Limits{})
		f, err := g.OpenDirFD()
		if m.Mode() == V1 {
			if !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("OpenDirFD on v1 = %v, want ErrUnavailable", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("OpenDirFD: %v", err)
		}
		defer f.Close()
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting into the group: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		if got := pids(t, g); !slices.Equal(got, []int{cmd.Process.Pid}) {
			t.Fatalf("Pids() = %v, want [%d]", got, cmd.Process.Pid)
		}
	})
}

func TestV2WithoutControllers(t *testing.T) {
	var hc *hierarchyCase
	for _, c := range hierarchies(t) {
		if c.h != nil {
			hc = &c
		}
	}
	if hc == nil {
		t.Skip("no cgroup2 mount without controllers on this host")
	}
	m := newTestManager(t, hc.h())
	if m.Mode() != V2 {
		t.Fatalf("Mode() = %v, want v2", m.Mode())
	}
	for _, l := range []Limits{{CPUs: 1}, {MemoryBytes: 64 << 20}, {Pids: 10}} {
		if _, err := m.Create("limited", l); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("Create(%+v) without controllers = %v, want ErrUnavailable", l, err)
		}
	}
	if names, _ := m.List(); len(names) != 0 {
		t.Errorf("refused Creates left %v", names)
	}
	g := createGroup(t, m, "plain", Limits{})
	if err := g.Update(Limits{}); err != nil {
		t.Errorf("Update to unlimited without controllers: %v", err)
	}
	if err := g.Update(Limits{Pids: 5}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Update(Pids) without controllers = %v, want ErrUnavailable", err)
	}
	if _, err := g.OpenOOMEvents(); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("OpenOOMEvents without the memory controller = %v, want ErrUnavailable", err)
	}
	if s := stats(t, g); s != (Stats{}) {
		t.Errorf("Stats of an idle group without controllers = %+v, want zero", s)
	}
}

func BenchmarkCreateDelete(b *testing.B) {
	m := newTestManager(b, nil)
	l := Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 100}
	ctx := context.Background()
	var (
		create time.Duration
		n      int
	)
	for ; b.Loop(); n++ {
		start := time.Now()
		g, err := m.Create(fmt.Sprintf("bench-%d", n), l)
		create += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Delete(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(create.Nanoseconds())/float64(n), "create-ns/op")
}

// TestRename: on v1 a group takes a new name with its processes and
// limits, refuses a name in use and then keeps its own; v2 refuses with
// ErrUnavailable and leaves the group as it was.
func TestRename(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		lim := Limits{Pids: 77}
		if m.Mode() != V1 {
			lim = Limits{} // v2 here may have no controllers enabled
		}
		g := createGroup(t, m, "rename-from", lim)
		p := startInGroup(t, g, "/bin/sh", "-c", "echo started; sleep 60")
		if line := p.readLine(t); line != "started" {
			t.Fatalf("process said %q", line)
		}
		taken := createGroup(t, m, "rename-taken", Limits{})
		if m.Mode() != V1 {
			if _, err := m.Rename(g, "rename-to"); !errors.Is(err, errdefs.ErrUnavailable) {
				t.Fatalf("Rename on %s = %v, want ErrUnavailable", m.Mode(), err)
			}
			if got := pids(t, g); !slices.Contains(got, p.cmd.Process.Pid) {
				t.Fatalf("after a refused rename Pids() = %v", got)
			}
			if err := g.Kill(); err != nil {
				t.Fatal(err)
			}
			return
		}
		if _, err := m.Rename(g, taken.Name()); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("Rename onto an existing group = %v, want ErrConflict", err)
		}
		if got := pids(t, g); !slices.Contains(got, p.cmd.Process.Pid) {
			t.Fatalf("after a refused rename Pids() = %v", got)
		}
		ng, err := m.Rename(g, "rename-to")
		if err != nil {
			t.Fatalf("Rename: %v", err)
		}
		t.Cleanup(func() {
			ng.Kill()
			ng.Delete(context.Background())
		})
		if got := pids(t, ng); !slices.Contains(got, p.cmd.Process.Pid) {
			t.Fatalf("renamed group's Pids() = %v, want %d", got, p.cmd.Process.Pid)
		}
		if _, err := m.Load("rename-from"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("old name still loads: %v", err)
		}
		if n, err := readInt(ng.d.(*v1Group).pids + "/pids.max"); err != nil || n != lim.Pids {
			t.Fatalf("renamed group's pids.max = %d, %v; want %d", n, err, lim.Pids)
		}
	})
}

// TestSetBackground: a background group has a nice-10 task's CPU weight
// and gets the kernel's default back; without the v2 CPU controller it
// is a no-op, and a group that is gone is reported as not found.
func TestSetBackground(t *testing.T) {
	forEachHierarchy(t, func(t *testing.T, m *Manager) {
		g := createGroup(t, m, "background", Limits{})
		weight := func() string {
			t.Helper()
			if d, ok := g.d.(*v2Group); ok && d.h.ctrl&ctrlCPU == 0 {
				return ""
			}
			return cpuFile(t, g, "cpu.shares", "cpu.weight")
		}
		want := map[bool]string{false: v1SharesDefault, true: v1SharesBackground}
		if v2, ok := m.h.(*v2Hierarchy); ok {
			want = map[bool]string{false: v2WeightDefault, true: v2WeightBackground}
			if v2.ctrl&ctrlCPU == 0 {
				want = map[bool]string{false: "", true: ""}
			}
		}
		if got := weight(); got != want[false] {
			t.Errorf("weight of a new group = %q, want %q", got, want[false])
		}
		for _, on := range []bool{true, false, true} {
			if err := g.SetBackground(on); err != nil {
				t.Fatalf("SetBackground(%v): %v", on, err)
			}
			if got := weight(); got != want[on] {
				t.Errorf("weight after SetBackground(%v) = %q, want %q", on, got, want[on])
			}
		}
		if err := g.Delete(context.Background()); err != nil {
			t.Fatal(err)
		}
		err := g.SetBackground(false)
		if want[false] != "" && !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("SetBackground of a deleted group = %v, want ErrNotFound", err)
		}
	})
}
