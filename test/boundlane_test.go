package test

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/wire"
)

// TestBoundLaneOutlivesTheDaemon: a lane bound to a sandbox is served by
// its guest, so an exec in flight on it runs to its end and reaches the
// client while the daemon is killed (-9); the lane then closes (no execs
// the daemon could not log), and the restarted daemon's exec log has the
// exec, output and exit, from the guest's reports and ring. (The kill
// comes after the exec has run for a second, by when the exec log has
// its record on disk, as for any exec.)
func TestBoundLaneOutlivesTheDaemon(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	_, fr, fw := rawLane(t, d, "/v1/sandboxes/"+id+"/lane")

	fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: id, Exec: api.ExecRequest{Cmd: []string{"sh", "-c", "echo begun; sleep 3; echo done"}}})
	pid := 0
	var out strings.Builder
	var st *api.ExitStatus
	for st == nil {
		f, err := fr.Read()
		if err != nil {
			t.Fatalf("reading the lane (stdout so far %q): %v", out.String(), err)
		}
		switch f.Type {
		case wire.Started:
			var s struct{ PID int }
			json.Unmarshal(f.Payload, &s)
			pid = s.PID
		case wire.Stdout:
			out.WriteString(string(f.Payload))
			if out.String() == "begun\n" {
				time.Sleep(1500 * time.Millisecond)
				d.Kill9()
			}
		case wire.Exit:
			st = new(api.ExitStatus)
			json.Unmarshal(f.Payload, st)
		default:
			t.Fatalf("frame %d %q", f.Type, f.Payload)
		}
	}
	if pid <= 1 || out.String() != "begun\ndone\n" || st.ExitCode != 0 {
		t.Fatalf("the exec across the daemon's kill: pid %d, stdout %q, exit %+v", pid, out.String(), st)
	}
	if f, err := fr.Read(); err == nil {
		t.Fatalf("the lane carried on without a daemon: frame %d %q", f.Type, f.Payload)
	}

	d.Start()
	logged, got := d.finishedLog(id, pid)
	if logged.Exit.ExitCode != 0 || strings.Join(logged.Cmd, " ") != "sh -c echo begun; sleep 3; echo done" {
		t.Errorf("logged: %+v", logged)
	}
	if got != "begun\ndone\n" {
		t.Errorf("logged output %q; want both lines", got)
	}
	// And the SDK's next exec takes a new lane.
	if s := d.Sh(id, "echo again"); s != "again\n" {
		t.Errorf("exec after the restart: %q", s)
	}
}

// TestBoundLaneSandboxEnds: an exec on a lane the guest serves ends with
// "sandbox ended" when the sandbox is deleted under it, not with a hang
// or a bare EOF.
func TestBoundLaneSandboxEnds(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id := d.Create(api.CreateRequest{})
	d.awaitBoundLane(id)
	started := make(chan int, 1)
	type result struct {
		st  *api.ExitStatus
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sleep", "60"}}, client.ExecIO{OnStart: func(p int) { started <- p }})
		done <- result{st, err}
	}()
	select {
	case <-started:
	case r := <-done:
		t.Fatalf("the exec ended before the delete: %+v %v", r.st, r.err)
	}
	if err := c.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.st == nil || r.st.ExitCode != -1 || r.st.Error != "sandbox ended" {
			t.Errorf("exec in a deleted sandbox: %+v %v; want exit -1, \"sandbox ended\"", r.st, r.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the exec did not end within 20 s of its sandbox's delete")
	}
}

// TestBoundLaneLargeOutput: output past what a lane's reports carry
// (256 KiB an exec) reaches the client whole and the exec log whole (the
// daemon fetches the rest from the guest's ring), and the exec's events
// are recorded.
func TestBoundLaneLargeOutput(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := d.Create(api.CreateRequest{})
	var out strings.Builder
	pid := 0
	st, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"seq", "1", "400000"}}, client.ExecIO{Stdout: &out, OnStart: func(p int) { pid = p }})
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("seq: %+v %v", st, err)
	}
	want := out.String()
	if len(want) < 2<<20 || !strings.HasSuffix(want, "\n400000\n") {
		t.Fatalf("seq printed %d bytes ending %q", len(want), want[max(0, len(want)-20):])
	}
	if _, got := d.finishedLog(id, pid); got != want {
		t.Errorf("the exec log kept %d bytes, the client got %d; they differ", len(got), len(want))
	}
	evs, err := c.Events(ctx, id, client.EventOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var began, ended bool
	for _, e := range evs {
		if e.Type == "exec" && strings.Contains(e.Message, "started seq 1 400000") {
			began = true
		}
		if e.Type == "exec" && strings.Contains(e.Message, "exited with code 0") && strings.Contains(string(e.Data), `"pid":`) {
			ended = ended || strings.Contains(string(e.Data), `"cmd":["seq","1","400000"]`)
		}
	}
	if !began || !ended {
		t.Errorf("events: started %v, exited %v; want both\n%+v", began, ended, evs)
	}
}

// awaitBoundLane waits until the SDK keeps an idle lane bound to sandbox
// id, which its guest serves: an exec that completes while the daemon is
// stopped (SIGSTOP) went through the guest alone. (The SDK's execs in a
// sandbox take the daemon's lane until it keeps a bound one, which it
// opens after the second.)
func (d *Daemon) awaitBoundLane(id string) {
	d.t.Helper()
	if !waitFor(20*time.Second, 10*time.Millisecond, func() bool {
		d.Sh(id, "true")
		time.Sleep(100 * time.Millisecond) // the lane opened ahead
		pid := d.cmd.Process.Pid
		syscall.Kill(pid, syscall.SIGSTOP)
		defer syscall.Kill(pid, syscall.SIGCONT)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := d.client.Exec(ctx, id, api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{})
		return err == nil
	}) {
		d.t.Fatal("the SDK has no lane bound to the sandbox after 20 s")
	}
}

// finishedLog waits up to 20 s for the exec log's finished record of
// process pid of sandbox id, and returns it with the output it kept.
func (d *Daemon) finishedLog(id string, pid int) (api.ExecLog, string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var rec api.ExecLog
	if !waitFor(20*time.Second, 50*time.Millisecond, func() bool {
		logs, err := d.client.Logs(ctx, id)
		for _, l := range logs {
			if l.PID == pid && l.Exit != nil {
				rec = l
			}
		}
		return err == nil && rec.Exit != nil
	}) {
		d.t.Fatalf("the exec log has no finished record of pid %d\n%s", pid, d.Log())
	}
	ls, err := d.client.Log(ctx, id, pid, client.LogOptions{})
	if err != nil {
		d.t.Fatal(err)
	}
	defer ls.Close()
	var out strings.Builder
	if _, err := ls.Wait(&out, nil); err != nil {
		d.t.Fatalf("reading the exec log of pid %d: %v", pid, err)
	}
	return rec, out.String()
}

// TestBoundLaneKeepsAwake: an exec on a lane the guest serves marks its
// sandbox busy (from the guest's report of its start), so auto-pause does
// not pause the sandbox under it; once it ends, auto-pause does, and the
// next exec resumes the sandbox on a lane of its new guest.
func TestBoundLaneKeepsAwake(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	c := d.Client()
	id := strings.TrimSpace(d.MustCLI("create", "--auto-pause", "2s"))
	d.awaitBoundLane(id)
	if _, _, st := d.Exec(id, "sleep", "4"); st.ExitCode != 0 || st.Error != "" {
		t.Fatalf("sleep 4 on the bound lane, auto-pause 2 s: %+v", st)
	}
	if st := state(t, c, id); st != api.StateRunning {
		t.Fatalf("paused while an exec on a bound lane ran: %s", st)
	}
	if !waitFor(15*time.Second, 100*time.Millisecond, func() bool { return state(t, c, id) == api.StatePaused }) {
		t.Fatal("not auto-paused within 15 s of the exec's end")
	}
	if out := d.Sh(id, "echo back"); out != "back\n" {
		t.Fatalf("after auto-pause: %q", out)
	}
	d.awaitBoundLane(id)
}
