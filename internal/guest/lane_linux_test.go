package guest

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/wire"
)

// handedLane hands the guest side of a socket pair to s as a lane bound
// to sandbox "box1" and returns the client's side and the report
// connection.
func handedLane(t *testing.T, c *guestapi.Client) (net.Conn, *guestapi.Conn) {
	t.Helper()
	ours, theirs := socketPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rep, err := c.HandLane(ctx, "box1", theirs.(*net.UnixConn))
	theirs.Close() // the guest has its own now
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Close() })
	ours.SetDeadline(time.Now().Add(30 * time.Second))
	rep.SetDeadline(time.Now().Add(30 * time.Second))
	return ours, rep
}

// socketPair returns the two ends of a unix stream socket pair; ours is
// closed when the test ends.
func socketPair(t *testing.T) (ours, theirs net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs, err = fileConns(fds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ours.Close() })
	return ours, theirs
}

// readUntil reads frames until one of type last, and returns them.
func readUntil(t *testing.T, fr *wire.Reader, last wire.Type, what string) []wire.Frame {
	t.Helper()
	var fs []wire.Frame
	for {
		f, err := fr.Read()
		if err != nil {
			t.Fatalf("%s: after %d frames: %v", what, len(fs), err)
		}
		f.Payload = append([]byte(nil), f.Payload...)
		fs = append(fs, f)
		if f.Type == last {
			return fs
		}
	}
}

// TestLaneReports: a lane handed to the guest runs execs and answers as
// the daemon's lane does, refuses requests for another sandbox, and
// reports each exec to the daemon: its start with pid and command, its
// output while the budget lasts and then byte counts that add up, and its
// exit. When the report connection closes, the idle lane closes.
func TestLaneReports(t *testing.T) {
	_, c := procClient(t)
	lane, rep := handedLane(t, c)
	fr, fw := wire.NewReader(lane), wire.NewWriter(lane)

	fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: "box2", Exec: api.ExecRequest{Cmd: []string{"true"}}})
	fs := readUntil(t, fr, wire.Error, "request for another sandbox")
	var e api.Error
	json.Unmarshal(fs[0].Payload, &e)
	if len(fs) != 1 || e.Status != 400 || !strings.Contains(e.Message, `sandbox box1, not "box2"`) {
		t.Errorf("request for another sandbox: %d frames, %+v", len(fs), e)
	}

	fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: "box1", Exec: api.ExecRequest{Cmd: []string{"sh", "-c", "echo hi; exit 4"}}})
	fs = readUntil(t, fr, wire.Exit, "echo")
	var started struct{ PID int }
	json.Unmarshal(fs[0].Payload, &started)
	if len(fs) != 3 || fs[0].Type != wire.Started || started.PID <= 0 || string(fs[1].Payload) != "hi\n" || !strings.Contains(string(fs[2].Payload), `"exit_code":4`) {
		t.Fatalf("echo on the lane: %v", fs)
	}
	reports := readUntil(t, rep.Frames, wire.Exit, "echo's reports")
	var rs guestapi.LaneStart
	json.Unmarshal(reports[0].Payload, &rs)
	if len(reports) != 3 || reports[0].Type != wire.Started || rs.PID != started.PID || strings.Join(rs.Cmd, " ") != "sh -c echo hi; exit 4" ||
		reports[1].Type != wire.Stdout || string(reports[1].Payload) != "hi\n" || string(reports[2].Payload) != string(fs[2].Payload) {
		t.Errorf("echo's reports: %v", reports)
	}

	const size = 3_000_000
	fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: "box1", Exec: api.ExecRequest{Cmd: []string{"head", "-c", "3000000", "/dev/zero"}}})
	got := 0
	for _, f := range readUntil(t, fr, wire.Exit, "head") {
		if f.Type == wire.Stdout {
			got += len(f.Payload)
		}
	}
	if got != size {
		t.Errorf("the client got %d bytes of %d", got, size)
	}
	carried, counted := 0, int64(0)
	for _, f := range readUntil(t, rep.Frames, wire.Exit, "head's reports") {
		switch f.Type {
		case wire.Stdout:
			if counted > 0 {
				t.Error("output carried after a count")
			}
			carried += len(f.Payload)
		case wire.Release:
			var d struct{ Bytes int64 }
			json.Unmarshal(f.Payload, &d)
			counted += d.Bytes
		}
	}
	if carried > reportBudget || carried == 0 || int64(carried)+counted != size {
		t.Errorf("head's reports carried %d bytes and counted %d; want at most %d carried and %d in all", carried, counted, reportBudget, size)
	}

	// The daemon goes: the idle lane closes.
	rep.Close()
	if f, err := fr.Read(); err == nil {
		t.Errorf("the lane stayed open without its report connection: frame %d", f.Type)
	}
}

// TestLaneCap: a guest serves at most maxLanes lanes; past that it
// refuses one (the daemon then serves it), and takes one again when a
// lane has closed.
func TestLaneCap(t *testing.T) {
	s, c := procClient(t)
	var lanes []net.Conn
	for range maxLanes {
		l, _ := handedLane(t, c)
		lanes = append(lanes, l)
	}
	_, theirs := socketPair(t)
	defer theirs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.HandLane(ctx, "box1", theirs.(*net.UnixConn)); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "lanes already") {
		t.Fatalf("lane %d: %v; want refused as unavailable", maxLanes+1, err)
	}
	lanes[0].Close()
	if !waitLanes(s, maxLanes-1) {
		t.Fatalf("%d lanes served after one closed; want %d", s.lanes.Load(), maxLanes-1)
	}
	handedLane(t, c)
}

// waitLanes waits up to 5 s for s to serve n lanes.
func waitLanes(s *server, n int64) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if s.lanes.Load() == n {
			return true
		}
	}
	return false
}
