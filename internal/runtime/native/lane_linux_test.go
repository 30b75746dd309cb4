package native

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/wire"
)

// testLane is an exec lane handed to a guest, as the daemon hands a
// client's (guestapi.Client.HandLane): the client's end and the guest's
// report connection.
type testLane struct {
	t    *testing.T
	conn net.Conn
	fr   *wire.Reader
	rep  *guestapi.Conn
}

const laneBox = "box1"

// unixPair returns the two ends of a unix stream socket pair, closed when
// the test ends.
func unixPair(t *testing.T) [2]net.Conn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conns[i].Close() })
	}
	return conns
}

func handLane(t *testing.T, guest *guestapi.Client) *testLane {
	t.Helper()
	conns := unixPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := guest.HandLane(ctx, laneBox, conns[1].(*net.UnixConn))
	conns[1].Close() // the guest has its own
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close() })
	conns[0].SetDeadline(time.Now().Add(time.Minute))
	rep.SetDeadline(time.Now().Add(time.Minute))
	return &testLane{t: t, conn: conns[0], fr: wire.NewReader(conns[0]), rep: rep}
}

// send writes a lane request for an exec (with a PATH: the test's
// sandboxes have none).
func (l *testLane) send(ex api.ExecRequest) {
	l.t.Helper()
	if ex.Env == nil {
		ex.Env = map[string]string{}
	}
	ex.Env["PATH"] = "/usr/bin:/bin"
	if err := wire.NewWriter(l.conn).WriteJSON(wire.Request, api.LaneRequest{Sandbox: laneBox, Exec: ex}); err != nil {
		l.t.Fatal(err)
	}
}

// laneExec is what one exec sent to a lane's client, or what its reports
// said of it.
type laneExec struct {
	pid            int
	cmd            []string // reports only
	stdout, stderr string
	passed         int64 // reports only
	exit           *api.ExitStatus
}

// read reads an exec's frames from fr: its start, its output and its
// exit, or (until set) up to stdout holding until. A report stream ends
// at an exit or an error frame.
func readExec(t *testing.T, fr *wire.Reader, until string) laneExec {
	t.Helper()
	var e laneExec
	var out, errs strings.Builder
	for {
		f, err := fr.Read()
		if err != nil {
			t.Fatalf("reading an exec's frames: %v (stdout %d bytes)", err, out.Len())
		}
		switch f.Type {
		case wire.Started:
			var st guestapi.LaneStart
			if err := json.Unmarshal(f.Payload, &st); err != nil {
				t.Fatal(err)
			}
			e.pid, e.cmd = st.PID, st.Cmd
		case wire.Stdout:
			out.Write(f.Payload)
		case wire.Stderr:
			errs.Write(f.Payload)
		case wire.Release:
			var p guestapi.LanePassed
			if err := json.Unmarshal(f.Payload, &p); err != nil {
				t.Fatal(err)
			}
			e.passed += p.Bytes
		case wire.Exit:
			e.exit = new(api.ExitStatus)
			if err := json.Unmarshal(f.Payload, e.exit); err != nil {
				t.Fatal(err)
			}
		case wire.Error:
			t.Fatalf("error frame: %s", f.Payload)
		default:
			t.Fatalf("frame type %d", f.Type)
		}
		e.stdout, e.stderr = out.String(), errs.String()
		if e.exit != nil || (until != "" && strings.Contains(e.stdout, until)) {
			return e
		}
	}
}

// exec runs one exec on the lane and returns what the client got and
// what the reports said.
func (l *testLane) exec(ex api.ExecRequest) (client, reports laneExec) {
	l.t.Helper()
	l.send(ex)
	client = readExec(l.t, l.fr, "")
	reports = readExec(l.t, l.rep.Frames, "")
	return client, reports
}

// TestFastGuestLanes: the fast guest serves an exec lane's plain execs
// itself, one thread, and reports each (its start with its command, its
// output up to the budget and then its count, its exit); a frame out of
// step gets an error and the lane closes; the daemon's going closes an
// idle lane.
func TestFastGuestLanes(t *testing.T) {
	guest, threads := fastSandbox(t)
	l := handLane(t, guest)
	c, r := l.exec(api.ExecRequest{Cmd: []string{"echo", "hi"}})
	if c.stdout != "hi\n" || c.exit == nil || c.exit.ExitCode != 0 || c.pid <= 0 {
		t.Fatalf("echo hi on a lane: %+v", c)
	}
	if r.pid != c.pid || strings.Join(r.cmd, " ") != "echo hi" || r.stdout != "hi\n" || r.exit == nil || r.exit.ExitCode != 0 {
		t.Fatalf("the reports of echo hi: %+v", r)
	}
	// Go's encoder writes <, > and & as \u escapes; UTF-8 goes as it is.
	c, r = l.exec(api.ExecRequest{Cmd: []string{"sh", "-c", "echo $FOO $HOME; pwd; echo \"$1\" >&2 && exit 4", "sh", "héllo"}, Env: map[string]string{"FOO": "bar"}, Cwd: "/tmp/"})
	if c.stdout != "bar /root\n/tmp\n" || c.stderr != "héllo\n" || c.exit.ExitCode != 4 || r.stderr != "héllo\n" || r.exit.ExitCode != 4 {
		t.Fatalf("an exec with env and cwd: %+v, reports %+v", c, r)
	}
	// A large request (its room is given back after it).
	big := strings.Repeat("x", 100<<10)
	if c, _ := l.exec(api.ExecRequest{Cmd: []string{"sh", "-c", "echo ${#BIG}"}, Env: map[string]string{"BIG": big}}); c.stdout != "102400\n" {
		t.Fatalf("an exec with a 100 KiB variable: %+v", c)
	}
	// Output past the reports' budget is counted, not carried.
	const size = 300 << 10
	c, r = l.exec(api.ExecRequest{Cmd: []string{"head", "-c", "307200", "/dev/zero"}})
	if len(c.stdout) != size || len(r.stdout) > 256<<10 || int64(len(r.stdout))+r.passed != size || r.passed == 0 {
		t.Fatalf("%d bytes of output: the client got %d, the reports carried %d and counted %d", size, len(c.stdout), len(r.stdout), r.passed)
	}
	// A lane's client that reads late gets it all, from the retained
	// output, with no handover.
	l.send(api.ExecRequest{Cmd: []string{"head", "-c", "4194304", "/dev/zero"}})
	time.Sleep(1500 * time.Millisecond)
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads with a lane's reader behind: the fast guest handed over", n)
	}
	c, r = readExec(t, l.fr, ""), readExec(t, l.rep.Frames, "")
	if len(c.stdout) != 4<<20 || c.exit == nil || c.exit.ExitCode != 0 || int64(len(r.stdout))+r.passed != 4<<20 {
		t.Fatalf("4 MiB read late from a lane: the client got %d bytes (%+v), the reports %d and %d counted", len(c.stdout), c.exit, len(r.stdout), r.passed)
	}
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads serving a lane: the fast guest handed over", n)
	}

	// The daemon's going closes an idle lane.
	l2 := handLane(t, guest)
	l2.rep.Close()
	if f, err := l2.fr.Read(); err == nil {
		t.Fatalf("an idle lane after the daemon went: frame %d %s", f.Type, f.Payload)
	}
	// A frame out of step: an error naming it, and the lane closes.
	l3 := handLane(t, guest)
	if err := wire.NewWriter(l3.conn).Write(wire.Stdin, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if f, err := l3.fr.Read(); err != nil || f.Type != wire.Error || !strings.Contains(string(f.Payload), "a lane takes request frames (type 32), not type 16") {
		t.Fatalf("a stdin frame on an idle lane: %v %d %s", err, f.Type, f.Payload)
	}
	if _, err := l3.fr.Read(); err == nil {
		t.Fatal("the lane stayed open after a frame out of step")
	}
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads: the fast guest handed over", n)
	}
	// The first lane still serves.
	if c, _ := l.exec(api.ExecRequest{Cmd: []string{"true"}}); c.exit == nil || c.exit.ExitCode != 0 {
		t.Fatalf("true on the first lane: %+v", c)
	}
}

// TestFastGuestLaneHandover: a handover takes the lanes where they stand:
// one streaming an exec goes on to its output and exit, its reports with
// it; one half-way through a request's frame serves it whole; a lane
// whose daemon went during its exec closes after it; and a lane request
// the fast guest does not serve (one with stdin) hands over itself.
func TestFastGuestLaneHandover(t *testing.T) {
	guest, threads := fastSandbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	busy, half, orphan := handLane(t, guest), handLane(t, guest), handLane(t, guest)
	busy.send(api.ExecRequest{Cmd: []string{"sh", "-c", "echo one; sleep 1; echo two >&2; exit 3"}})
	if c := readExec(t, busy.fr, "one\n"); c.stdout != "one\n" || c.exit != nil {
		t.Fatalf("the busy lane's first output: %+v %+v", c, c.exit)
	}
	if r := readExec(t, busy.rep.Frames, "one\n"); r.stdout != "one\n" || r.pid <= 0 {
		t.Fatalf("the busy lane's first reports: %+v", r)
	}
	orphan.send(api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 0.5; echo late"}})
	if f, err := orphan.fr.Read(); err != nil || f.Type != wire.Started { // held 5 ms at most
		t.Fatalf("the orphan lane's start: %v, frame %d", err, f.Type)
	}
	orphan.rep.Close()
	payload, _ := json.Marshal(api.LaneRequest{Sandbox: laneBox, Exec: api.ExecRequest{Cmd: []string{"echo", "whole"}, Env: map[string]string{"PATH": "/bin"}}})
	frame := wire.AppendFrame(nil, wire.Request, payload)
	if _, err := half.conn.Write(frame[:12]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // the fast guest reads the half
	if n := threads(); n != 2 {
		t.Fatalf("the guest runs %d threads before the handover", n)
	}
	if _, err := guest.Processes(ctx); err != nil {
		t.Fatalf("list (the handover): %v", err)
	}
	if n := threads(); n <= 2 {
		t.Fatalf("the guest runs %d threads after the list: no handover", n)
	}
	if c := readExec(t, busy.fr, ""); c.stdout != "" || c.stderr != "two\n" || c.exit == nil || c.exit.ExitCode != 3 {
		t.Fatalf("the busy lane after the handover: %+v", c)
	}
	if r := readExec(t, busy.rep.Frames, ""); r.stdout != "" || r.stderr != "two\n" || r.exit == nil || r.exit.ExitCode != 3 {
		t.Fatalf("the busy lane's reports after the handover: %+v", r)
	}
	if c, r := busy.exec(api.ExecRequest{Cmd: []string{"echo", "again"}}); c.stdout != "again\n" || r.stdout != "again\n" || strings.Join(r.cmd, " ") != "echo again" {
		t.Fatalf("the busy lane's next exec: %+v, reports %+v", c, r)
	}
	if _, err := half.conn.Write(frame[12:]); err != nil {
		t.Fatal(err)
	}
	if c := readExec(t, half.fr, ""); c.stdout != "whole\n" || c.exit == nil || c.exit.ExitCode != 0 {
		t.Fatalf("the half-sent request after the handover: %+v", c)
	}
	if c := readExec(t, orphan.fr, ""); c.stdout != "late\n" || c.exit == nil {
		t.Fatalf("the orphan lane's exec: %+v", c)
	}
	if f, err := orphan.fr.Read(); err == nil {
		t.Fatalf("a lane whose daemon went stayed open after its exec: frame %d", f.Type)
	}

	// A request the fast guest does not serve hands over with its lane.
	guest, threads = fastSandbox(t)
	l := handLane(t, guest)
	in := "piped"
	c, r := l.exec(api.ExecRequest{Cmd: []string{"cat"}, Stdin: &in})
	if c.stdout != "piped" || c.exit == nil || c.exit.ExitCode != 0 || r.stdout != "piped" {
		t.Fatalf("an exec with stdin on a lane: %+v, reports %+v", c, r)
	}
	if n := threads(); n <= 2 {
		t.Fatalf("the guest runs %d threads after an exec with stdin: the fast guest served it", n)
	}
}
