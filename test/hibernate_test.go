package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

func state(t *testing.T, c *client.Client, id string) api.State {
	t.Helper()
	sb, err := c.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.State
}

// TestPauseResume: a paused sandbox has no process and no cgroup, keeps
// its files, env and limits, survives a daemon kill -9, and comes back with
// the same id, explicitly or on the next call that needs it.
func TestPauseResume(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{Env: map[string]string{"KEEP": "me"}, Resources: api.Resources{MemoryBytes: 200 << 20, Pids: 64}})
	d.Sh(id, "echo kept > /workspace/file; mkdir -p /home/user/.cache && echo x > /home/user/.cache/y")
	before, _ := c.Get(ctx, id)
	const owners = "stat -c '%u:%g %n' /workspace/file /home/user/.cache/y"
	ownersBefore := d.Sh(id, owners)

	if out := d.MustCLI("pause", id); strings.TrimSpace(out) != id {
		t.Fatalf("pause printed %q", out)
	}
	if st := state(t, c, id); st != api.StatePaused {
		t.Fatalf("state %s after pause", st)
	}
	// No process left on the host, no cgroup.
	if pid := before.Runtime.HostPID; alive(pid) {
		t.Fatalf("guest %d still alive after pause", pid)
	}
	for _, dir := range cgroupDirs(d.Cgroup) {
		if _, err := statDir(dir + "/" + id); err == nil {
			t.Fatalf("cgroup %s/%s still there after pause", dir, id)
		}
	}

	// Paused sandboxes survive a daemon crash.
	d.Kill9()
	d.Start()
	c = d.Client()
	if st := state(t, c, id); st != api.StatePaused {
		t.Fatalf("state %s after a daemon restart, want paused", st)
	}

	if _, err := c.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	after, _ := c.Get(ctx, id)
	if after.State != api.StateRunning || after.ID != id || after.Resources != before.Resources {
		t.Fatalf("after resume: %+v\nbefore: %+v", after, before)
	}
	// The resume may run on a blank guest with a uid range of its own
	// (Manager.rebase): the files' owners, as the sandbox sees them, stay.
	if got := d.Sh(id, owners); got != ownersBefore {
		t.Fatalf("owners after resume (uid base %d, was %d):\n%s\nbefore:\n%s", after.Runtime.UIDBase, before.Runtime.UIDBase, got, ownersBefore)
	}
	if out := d.Sh(id, "cat /workspace/file /home/user/.cache/y; echo $KEEP; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || true"); !strings.HasPrefix(out, "kept\nx\nme\n") {
		t.Fatalf("after resume: %q", out)
	}
	// The memory limit is back in force.
	if sb, _ := c.Get(ctx, id); sb.Runtime == nil || sb.Runtime.Cgroup == "" {
		t.Fatalf("no cgroup after resume: %+v", sb.Runtime)
	}

	// Auto-resume: an exec on a paused sandbox resumes it.
	d.MustCLI("pause", id)
	if out, _, st := d.Exec(id, "cat", "/workspace/file"); st.ExitCode != 0 || out != "kept\n" {
		t.Fatalf("exec on a paused sandbox: %q %+v", out, st)
	}
	if st := state(t, c, id); st != api.StateRunning {
		t.Fatalf("state %s after an exec auto-resumed it", st)
	}
}

func TestNoAutoResume(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	id := strings.TrimSpace(d.MustCLI("create", "--no-auto-resume"))
	d.MustCLI("pause", id)
	_, err := c.Exec(context.Background(), id, api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{})
	if !errors.Is(err, client.ErrConflict) {
		t.Fatalf("exec on a paused sandbox without auto-resume: %v, want conflict", err)
	}
	if r := d.CLI("pause", "no-such-sandbox"); r.Code == 0 || !strings.Contains(r.Stderr, "not found") {
		t.Fatalf("pause of an unknown sandbox: %+v", r)
	}
}

func TestAutoPause(t *testing.T) {
	t.Parallel()
	d := StartDaemon(t)
	c := d.Client()
	id := strings.TrimSpace(d.MustCLI("create", "--auto-pause", "2s"))
	// A running stream keeps it awake.
	if _, _, st := d.Exec(id, "sleep", "3"); st.ExitCode != 0 {
		t.Fatalf("sleep: %+v", st)
	}
	if st := state(t, c, id); st != api.StateRunning {
		t.Fatalf("paused while a stream was open: %s", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for state(t, c, id) != api.StatePaused {
		if time.Now().After(deadline) {
			t.Fatal("not auto-paused within 10 s of being idle for 2 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// And auto-resumed by the next call.
	if out := d.Sh(id, "echo back"); out != "back\n" {
		t.Fatalf("after auto-pause: %q", out)
	}
}

func TestFreezeThaw(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})
	p, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sh", "-c", "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := c.Freeze(ctx, id); err != nil {
		t.Fatal(err)
	}
	if st := state(t, c, id); st != api.StateFrozen {
		t.Fatalf("state %s after freeze", st)
	}
	read := func() string {
		b, err := readFileIn(before(c, id), "/tmp/count")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	n1 := read()
	time.Sleep(400 * time.Millisecond)
	if n2 := read(); n1 != n2 {
		t.Fatalf("a frozen process made progress: %s then %s", n1, n2)
	}
	if _, err := c.Thaw(ctx, id); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	if n3 := read(); n3 == n1 {
		t.Fatalf("no progress after thaw: still %s", n3)
	}
	// A frozen sandbox is thawed by the next call that needs it.
	c.Freeze(ctx, id)
	if out := d.Sh(id, "echo ok"); out != "ok\n" {
		t.Fatalf("exec on a frozen sandbox: %q", out)
	}
	// A frozen sandbox stays frozen through a daemon's kill -9 and
	// restart (it cannot answer a ping while frozen), and thaws after.
	c.Freeze(ctx, id)
	n4 := read()
	d.Kill9()
	d.Start()
	c = d.Client()
	if st := state(t, c, id); st != api.StateFrozen {
		t.Fatalf("state %s after a restart of the daemon of a frozen sandbox\n%s", st, d.Log())
	}
	time.Sleep(300 * time.Millisecond)
	if n5 := read(); n5 != n4 {
		t.Fatalf("a frozen process made progress across a restart: %s then %s", n4, n5)
	}
	if _, err := c.Thaw(ctx, id); err != nil {
		t.Fatal(err)
	}
	if !waitFor(5*time.Second, 50*time.Millisecond, func() bool { return read() != n4 }) {
		t.Fatalf("no progress after a thaw following a restart")
	}
	c.Signal(ctx, id, p.PID, "KILL")
	// Stop and rm work on a frozen sandbox.
	c.Freeze(ctx, id)
	d.MustCLI("rm", "-f", id)
}

// before returns the sandbox's guest pid (for reading its files from the
// host without going through the sandbox, which may be frozen).
func before(c *client.Client, id string) int {
	sb, err := c.Get(context.Background(), id)
	if err != nil || sb.Runtime == nil {
		return 0
	}
	return sb.Runtime.HostPID
}

func statDir(path string) (os.FileInfo, error) { return os.Stat(path) }

// readFileIn reads a file of a sandbox from the host through its guest's
// root (/proc/PID/root), without entering it.
func readFileIn(pid int, path string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s", pid, path))
	return strings.TrimSpace(string(b)), err
}
