package test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// TestExecDetach drives `paddock exec -d` as docker exec -d is used: it
// prints the process's id at once, and ps, logs --exec, attach and kill
// take that id.
func TestExecDetach(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.createCLI()

	// A process that outlives the CLI: exec -d returns while it runs.
	start := time.Now()
	out := d.MustCLI("exec", "-d", "-e", "WHO=detached", "-w", "/tmp", id, "--",
		"sh", "-c", `echo "$WHO in $(pwd)"; echo to-stderr >&2; trap 'echo got-term; exit 7' TERM; while :; do sleep 0.05; done`)
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("exec -d took %v", took)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || pid <= 1 {
		t.Fatalf("exec -d printed %q, want one pid", out)
	}
	if p := waitState(t, c, id, pid, "running"); p.State != "running" {
		t.Fatalf("process %+v", p)
	}
	if o := d.MustCLI("ps", id); !strings.Contains(o, strconv.Itoa(pid)) || !strings.Contains(o, "running") {
		t.Fatalf("ps does not show %d running:\n%s", pid, o)
	}
	if !waitFor(10*time.Second, 50*time.Millisecond, func() bool {
		return strings.Contains(d.CLI("logs", "--exec", strconv.Itoa(pid), id).Stdout, "detached in /tmp")
	}) {
		t.Fatalf("logs --exec %d: %+v", pid, d.CLI("logs", "--exec", strconv.Itoa(pid), id))
	}

	// kill takes the id; attach then replays what it wrote and exits with
	// its code. (The signal goes to the group, so sh may also report its
	// sleep terminated on stderr.)
	d.MustCLI("kill", id, strconv.Itoa(pid))
	fin := waitState(t, c, id, pid, "exited")
	if fin.Exit == nil || fin.Exit.ExitCode != 7 {
		t.Fatalf("exit %+v, want 7 from the TERM trap", fin.Exit)
	}
	r := d.CLI("attach", id, strconv.Itoa(pid))
	if r.Code != 7 || r.Stdout != "detached in /tmp\ngot-term\n" || !strings.HasPrefix(r.Stderr, "to-stderr\n") {
		t.Fatalf("attach: %+v", r)
	}

	// -i keeps stdin open for a later attach -i; -t gives a terminal.
	out = d.MustCLI("exec", "-d", "-i", id, "--", "sh", "-c", "read l; echo got:$l")
	pid, _ = strconv.Atoi(strings.TrimSpace(out))
	if err := c.SendInputBytes(ctx, id, pid, []byte("hi\n"), true); err != nil {
		t.Fatalf("input to exec -d -i: %v", err)
	}
	if r := d.CLI("attach", id, strconv.Itoa(pid)); r.Code != 0 || r.Stdout != "got:hi\n" {
		t.Fatalf("attach after input: %+v", r)
	}
	out = d.MustCLI("exec", "-d", "-t", id, "--", "sh", "-c", "test -t 1 && stty size")
	pid, _ = strconv.Atoi(strings.TrimSpace(out))
	fin = waitState(t, c, id, pid, "exited")
	if !fin.TTY || fin.Exit == nil || fin.Exit.ExitCode != 0 {
		t.Fatalf("exec -d -t: %+v", fin)
	}

	// Errors come back before anything runs: a missing command, a
	// missing sandbox.
	if r := d.CLI("exec", "-d", id, "--", "no-such-command"); r.Code == 0 || !strings.Contains(r.Stderr, "no-such-command") {
		t.Fatalf("exec -d of a missing command: %+v", r)
	}
	if r := d.CLI("exec", "-d", "nosuchsandbox", "--", "true"); r.Code == 0 {
		t.Fatalf("exec -d in a missing sandbox: %+v", r)
	}
	if _, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatalf("the sandbox stopped serving: %v", err)
	}
}
