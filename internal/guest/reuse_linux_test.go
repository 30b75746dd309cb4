package guest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/wire"
)

// pairDialer dials a socketpair whose far end serve handles, counting
// the dials.
func pairDialer(t *testing.T, dials *atomic.Int32, serve func(net.Conn)) func(context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		dials.Add(1)
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		ours, theirs, err := fileConns(fds)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { theirs.Close() })
		go serve(theirs)
		return ours, nil
	}
}

// procServer is a guest server that can start processes: its spawner
// thread dropped to no capabilities.
func procServer(t *testing.T) *server {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root (the spawner unshares a cgroup namespace)")
	}
	sp := startSpawner()
	if err := sp.restrict(nil, false, true, -1); err != nil {
		t.Fatal(err)
	}
	return newServer(guestapi.ServeConfig{Workdir: "/", Env: []string{"PATH=/usr/bin:/bin"}}, nil, sp, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// procClient is a procServer and a Client whose connections it serves.
func procClient(t *testing.T) (*server, *guestapi.Client) {
	t.Helper()
	s := procServer(t)
	var dials atomic.Int32
	c := guestapi.NewClient(pairDialer(t, &dials, s.handle))
	t.Cleanup(c.Close)
	return s, c
}

// attachedRun is what a command started attached left: its output, its
// exit, its pid and the connection its stream came on.
type attachedRun struct {
	stdout, stderr string
	status         api.ExitStatus
	pid            int
	conn           *guestapi.Conn
}

// runAttachedAll starts cmd attached and reads its stream to the exit
// frame.
func runAttachedAll(t *testing.T, c *guestapi.Client, cmd ...string) attachedRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pid, conn, err := c.StartAttached(ctx, &guestapi.StartRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("start %v: %v", cmd, err)
	}
	r := attachedRun{pid: pid, conn: conn}
	var out, errOut strings.Builder
	for {
		f, err := conn.Frames.Read()
		if err != nil {
			t.Fatalf("stream of %v: %v", cmd, err)
		}
		switch f.Type {
		case wire.Stdout:
			out.Write(f.Payload)
		case wire.Stderr:
			errOut.Write(f.Payload)
		case wire.Exit:
			if err := json.Unmarshal(f.Payload, &r.status); err != nil {
				t.Fatal(err)
			}
			r.stdout, r.stderr = out.String(), errOut.String()
			return r
		}
	}
}

// runAttached is runAttachedAll for callers that need stdout, the exit
// and the connection.
func runAttached(t *testing.T, c *guestapi.Client, cmd ...string) (string, api.ExitStatus, *guestapi.Conn) {
	t.Helper()
	r := runAttachedAll(t, c, cmd...)
	return r.stdout, r.status, r.conn
}

// TestStreamConnectionReuse: a process stream released after its exit
// leaves its connection to the next call, which the guest serves on it.
func TestStreamConnectionReuse(t *testing.T) {
	s := procServer(t)
	var dials atomic.Int32
	c := guestapi.NewClient(pairDialer(t, &dials, s.handle))
	t.Cleanup(c.Close)

	var first net.Conn
	for i, tc := range []struct {
		cmd  []string
		out  string
		code int
	}{
		{[]string{"true"}, "", 0},
		{[]string{"sh", "-c", "echo hi; exit 3"}, "hi\n", 3},
		{[]string{"no-such-command-here"}, "", 127},
		{[]string{"echo", "again"}, "again\n", 0},
	} {
		out, st, conn := runAttached(t, c, tc.cmd...)
		if out != tc.out || st.ExitCode != tc.code {
			t.Errorf("call %d %v: output %q, exit %d; want %q, %d", i, tc.cmd, out, st.ExitCode, tc.out, tc.code)
		}
		if first == nil {
			first = conn.Conn
		} else if conn.Conn != first {
			t.Errorf("call %d %v went on a new connection", i, tc.cmd)
		}
		conn.Release()
		conn.Close() // after Release: leaves the kept connection alone
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials for 4 released streams, want 1", n)
	}
	// A stream the caller closes instead is not reused.
	_, _, conn := runAttached(t, c, "true")
	conn.Close()
	_, _, next := runAttached(t, c, "true")
	if next.Conn == first {
		t.Error("a closed stream's connection was used again")
	}
	next.Close()
}

// TestStaleKeptConnection: a guest that closes a connection after the
// stream (one from before streams were released) leaves a kept
// connection that is closed; the next call is sent on a new one.
func TestStaleKeptConnection(t *testing.T) {
	s := procServer(t)
	var dials atomic.Int32
	oneShot := func(conn net.Conn) {
		defer conn.Close()
		c := newOpConn(conn)
		f, err := c.fr.Read()
		if err != nil {
			return
		}
		var req guestapi.Request
		json.Unmarshal(f.Payload, &req)
		processOps[req.Op](s, c, req)
		// An old guest closes here whatever the client sent.
	}
	c := guestapi.NewClient(pairDialer(t, &dials, oneShot))
	t.Cleanup(c.Close)
	for i := range 3 {
		out, st, conn := runAttached(t, c, "echo", "ok")
		if out != "ok\n" || st.ExitCode != 0 {
			t.Fatalf("call %d: output %q, exit %d", i, out, st.ExitCode)
		}
		conn.Release()
		time.Sleep(20 * time.Millisecond) // the old guest has closed it
	}
	if n := dials.Load(); n < 3 {
		t.Errorf("%d dials for 3 calls on one-shot connections, want at least 3", n)
	}
	// Once one was found closed, streams are no longer kept: no call
	// after the first retry tries a closed connection again.
	_, _, conn := runAttached(t, c, "true")
	conn.Release()
	if err := conn.Conn.SetReadDeadline(time.Time{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a released stream's connection with reuse off: %v, want it closed", err)
	}
}

// TestFinishedOutputBounded: the output the guest keeps of its finished
// processes together stays within FinishedOutputFactor times the
// per-process limit, the oldest's going first; their records stay, and
// an attach from the start gets a dropped frame for what went, then the
// exit.
func TestFinishedOutputBounded(t *testing.T) {
	s, c := procClient(t)
	const limit = 1 << 20
	s.cfg.OutputLimit = limit
	var pids []int
	for range 2 * FinishedOutputFactor {
		r := runAttachedAll(t, c, "head", "-c", strconv.Itoa(limit), "/dev/zero")
		r.conn.Close()
		if len(r.stdout) != limit {
			t.Fatalf("a run's stream: %d bytes", len(r.stdout))
		}
		pids = append(pids, r.pid)
	}
	s.mu.Lock()
	var total int64
	for _, pid := range s.finished {
		total += s.procs[pid].out.retained()
	}
	s.mu.Unlock()
	if total > FinishedOutputFactor*limit {
		t.Fatalf("finished processes keep %d bytes of output, past %d", total, FinishedOutputFactor*limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, pid := range []int{pids[0], pids[len(pids)-1]} {
		p, err := c.Process(ctx, pid)
		if err != nil || p.OutputBytes != limit || p.Exit == nil {
			t.Fatalf("the record of %d: %+v, %v", pid, p, err)
		}
		conn, err := c.Attach(ctx, pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got, dropped int
		for done := false; !done; {
			f, err := conn.Frames.Read()
			if err != nil {
				t.Fatal(err)
			}
			switch f.Type {
			case wire.Stdout:
				got += len(f.Payload)
			case wire.Dropped:
				var d struct{ Bytes int }
				json.Unmarshal(f.Payload, &d)
				dropped += d.Bytes
			case wire.Exit:
				done = true
			}
		}
		conn.Close()
		if want := [][2]int{{0, limit}, {limit, 0}}[i]; got != want[0] || dropped != want[1] {
			t.Fatalf("attached to %d from the start: %d bytes and %d dropped, want %d and %d", pid, got, dropped, want[0], want[1])
		}
	}
}
