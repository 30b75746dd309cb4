package test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/wire"
)

// rawLane opens an exec lane on a connection of its own: the daemon's
// (path /v1/lane) or one bound to a sandbox (/v1/sandboxes/{id}/lane).
func rawLane(t *testing.T, d *Daemon, path string) (net.Conn, *wire.Reader, *wire.Writer) {
	return rawLaneAt(t, "unix", d.Sock, "", path)
}

// rawLaneAt opens an exec lane at a listener of the daemon's, with a
// bearer token if one is given.
func rawLaneAt(t *testing.T, network, addr, token, path string) (net.Conn, *wire.Reader, *wire.Writer) {
	t.Helper()
	conn, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	conn.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: paddock\r\n" + auth + "Connection: Upgrade\r\nUpgrade: " + api.LaneProtocol + "\r\n\r\n"))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade to a lane: %v %v", resp, err)
	}
	return conn, wire.NewReader(br), wire.NewWriter(conn)
}

// laneError reads an error frame and returns its body.
func laneError(t *testing.T, fr *wire.Reader, what string) api.Error {
	t.Helper()
	f, err := fr.Read()
	if err != nil || f.Type != wire.Error {
		t.Fatalf("%s: frame %v %q, %v; want an error frame", what, f.Type, f.Payload, err)
	}
	var e api.Error
	if err := json.Unmarshal(f.Payload, &e); err != nil {
		t.Fatalf("%s: error frame %q: %v", what, f.Payload, err)
	}
	return e
}

// TestLaneHostileInput: an exec lane answers bad requests with an error
// frame naming what was wrong, with the status the HTTP API would have
// given, and takes the next request; a frame of another type ends it. A
// good exec on the same lane runs after the bad ones. The same for the
// daemon's lane and for one bound to a sandbox, which its guest serves
// (and which refuses requests for other sandboxes).
func TestLaneHostileInput(t *testing.T) {
	t.Parallel()
	d, token, tcpAddr := newTCPDaemon(t)
	id := d.Create(api.CreateRequest{})
	bound := "/v1/sandboxes/" + id + "/lane"
	t.Run("daemon", func(t *testing.T) { laneHostileInput(t, d, id, false, "unix", d.Sock, token, "/v1/lane") })
	// On the unix socket the guest serves a bound lane; over TCP the
	// daemon does. Both answer alike.
	t.Run("bound", func(t *testing.T) { laneHostileInput(t, d, id, true, "unix", d.Sock, token, bound) })
	t.Run("bound over TCP", func(t *testing.T) { laneHostileInput(t, d, id, true, "tcp", tcpAddr, token, bound) })
}

func laneHostileInput(t *testing.T, d *Daemon, id string, bound bool, network, addr, token, path string) {
	conn, fr, fw := rawLaneAt(t, network, addr, token, path)
	type answer struct {
		code, mention string
		status        int
	}
	unknown := answer{"not_found", "nosuchbox", 404}
	hostile := answer{"invalid_argument", "not a sandbox id", 400}
	if bound {
		unknown = answer{"invalid_argument", "this lane runs commands in sandbox " + id + `, not "nosuchbox"`, 400}
		hostile = answer{"invalid_argument", `not "../../etc"`, 400}
	}
	for _, tc := range []struct {
		name, payload string
		want          answer
	}{
		{"truncated JSON", `{"sandbox":`, answer{"invalid_argument", "truncated JSON", 400}},
		{"malformed JSON", `{"sandbox":}`, answer{"invalid_argument", "malformed JSON", 400}},
		{"unknown field", `{"sandbox":"` + id + `","exec":{"cmd":["true"]},"x":1}`, answer{"invalid_argument", "x", 400}},
		{"no command", `{"sandbox":"` + id + `","exec":{}}`, answer{"invalid_argument", "cmd", 400}},
		{"NUL in argument", `{"sandbox":"` + id + `","exec":{"cmd":["echo","a\u0000b"]}}`, answer{"invalid_argument", "NUL", 400}},
		{"bad variable name", `{"sandbox":"` + id + `","exec":{"cmd":["true"],"env":{"A=B":"x"}}}`, answer{"invalid_argument", "not a valid variable name", 400}},
		{"relative cwd", `{"sandbox":"` + id + `","exec":{"cmd":["true"],"cwd":"../.."}}`, answer{"invalid_argument", "absolute", 400}},
		{"cwd not a directory", `{"sandbox":"` + id + `","exec":{"cmd":["true"],"cwd":"/etc/passwd"}}`, answer{"invalid_argument", "not a directory", 400}},
		{"unknown user", `{"sandbox":"` + id + `","exec":{"cmd":["true"],"user":"nosuchuser"}}`, answer{"invalid_argument", `unknown user "nosuchuser"`, 400}},
		{"terminal", `{"sandbox":"` + id + `","exec":{"cmd":["sh"],"tty":{"cols":80,"rows":24}}}`, answer{"invalid_argument", "Upgrade", 400}},
		{"unknown sandbox", `{"sandbox":"nosuchbox","exec":{"cmd":["true"]}}`, unknown},
		{"hostile sandbox id", `{"sandbox":"../../etc","exec":{"cmd":["true"]}}`, hostile},
		{"oversized", `{"sandbox":"` + id + `","exec":{"cmd":["` + strings.Repeat("a", 2<<20) + `"]}}`, answer{"too_large", "exceeds", 413}},
	} {
		if err := fw.Write(wire.Request, []byte(tc.payload)); err != nil {
			t.Fatalf("%s: writing: %v", tc.name, err)
		}
		e := laneError(t, fr, tc.name)
		if e.Code != tc.want.code || e.Status != tc.want.status || !strings.Contains(e.Message, tc.want.mention) {
			t.Errorf("%s: error %+v, want code %s, status %d, message naming %q", tc.name, e, tc.want.code, tc.want.status, tc.want.mention)
		}
	}

	// The lane still runs an exec, and another after it; a missing
	// command ends with 127 as in a shell.
	for i := range 3 {
		cmd := []string{"sh", "-c", "echo out; echo err >&2; exit 3"}
		if i == 2 {
			cmd = []string{"nosuchcommand"}
		}
		fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: id, Exec: api.ExecRequest{Cmd: cmd}})
		var out, errOut string
		var st api.ExitStatus
		pid := -1
		for done := false; !done; {
			f, err := fr.Read()
			if err != nil {
				t.Fatalf("exec %d: %v", i, err)
			}
			switch f.Type {
			case wire.Started:
				var s struct{ PID int }
				json.Unmarshal(f.Payload, &s)
				pid = s.PID
			case wire.Stdout:
				out += string(f.Payload)
			case wire.Stderr:
				errOut += string(f.Payload)
			case wire.Exit:
				json.Unmarshal(f.Payload, &st)
				done = true
			default:
				t.Fatalf("exec %d: unexpected frame %d %q", i, f.Type, f.Payload)
			}
		}
		if i == 2 {
			if pid != 0 || st.ExitCode != 127 || !strings.Contains(st.Error, "nosuchcommand") {
				t.Errorf("missing command on the lane: pid %d, exit %+v", pid, st)
			}
			continue
		}
		if pid <= 1 || out != "out\n" || errOut != "err\n" || st.ExitCode != 3 {
			t.Errorf("exec %d on the lane: pid %d, stdout %q, stderr %q, exit %+v", i, pid, out, errOut, st)
		}
	}

	if bound && network == "unix" {
		// Served by the sandbox's guest: it answers while the daemon is
		// stopped.
		pid := d.cmd.Process.Pid
		syscall.Kill(pid, syscall.SIGSTOP)
		fw.WriteJSON(wire.Request, api.LaneRequest{Sandbox: id, Exec: api.ExecRequest{Cmd: []string{"echo", "guest"}}})
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		var out string
		var err error
		for f := (wire.Frame{}); err == nil && f.Type != wire.Exit; {
			if f, err = fr.Read(); err == nil && f.Type == wire.Stdout {
				out += string(f.Payload)
			}
		}
		syscall.Kill(pid, syscall.SIGCONT)
		conn.SetReadDeadline(time.Now().Add(60 * time.Second))
		if err != nil || out != "guest\n" {
			t.Errorf("an exec on the bound lane while the daemon is stopped: %q, %v", out, err)
		}
	}

	// A frame that is not a request ends the lane, after saying why.
	fw.Write(wire.Stdin, []byte("hello"))
	if e := laneError(t, fr, "stdin frame"); e.Code != "invalid_argument" || !strings.Contains(e.Message, "request frames") {
		t.Errorf("stdin frame: %+v", e)
	}
	if f, err := fr.Read(); err == nil {
		t.Errorf("the lane carried on after a stray frame: %v %q", f.Type, f.Payload)
	}
	// And the daemon kept serving.
	if got := d.Sh(id, "echo alive"); got != "alive\n" {
		t.Errorf("after the hostile lane: %q", got)
	}
}

// TestLaneSDK: the SDK's Exec goes through a kept lane: typed errors, a
// cancelled exec that leaves its process running and its lane closed, and
// execs after a daemon restart, which closes every lane.
func TestLaneSDK(t *testing.T) {
	t.Parallel()
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})

	if _, err := c.Exec(ctx, "nosuchbox", api.ExecRequest{Cmd: []string{"true"}}, client.ExecIO{}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("exec in a missing sandbox: %v, want ErrNotFound", err)
	} else if ce := (*client.Error)(nil); !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
		t.Errorf("exec in a missing sandbox: %#v, want status 404", err)
	}
	if _, err := c.Exec(ctx, id, api.ExecRequest{}, client.ExecIO{}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("exec without a command: %v, want ErrInvalid", err)
	}
	var out strings.Builder
	var pid int
	st, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "echo $PPID"}}, client.ExecIO{Stdout: &out, OnStart: func(p int) { pid = p }})
	if err != nil || st.ExitCode != 0 || pid <= 1 {
		t.Fatalf("exec: %+v %v pid %d", st, err, pid)
	}

	// The exec log has what went through the lane: output and exit.
	if rec, logged := d.finishedLog(id, pid); rec.Exit.ExitCode != 0 || logged != out.String() {
		t.Errorf("exec log of pid %d: %q %+v, want %q and exit 0", pid, logged, rec.Exit, out.String())
	}

	// Cancelled: Exec returns at once, the process runs on.
	cctx, cancel := context.WithCancel(ctx)
	started := make(chan int, 1)
	go func() {
		<-started
		cancel()
	}()
	_, err = c.Exec(cctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 2; echo done > /tmp/lane-done"}}, client.ExecIO{OnStart: func(p int) { started <- p }})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled exec: %v", err)
	}
	if !waitFor(15*time.Second, 100*time.Millisecond, func() bool { return d.Sh(id, "cat /tmp/lane-done 2>/dev/null || true") == "done\n" }) {
		t.Error("the cancelled exec's process did not run to its end")
	}

	// The lanes kept across a restart are closed by it; the next exec
	// opens a new one.
	d.Kill9()
	d.Start()
	for i := range 3 {
		out.Reset()
		if st, err := c.Exec(ctx, id, api.ExecRequest{Cmd: []string{"echo", "again"}}, client.ExecIO{Stdout: &out}); err != nil || st.ExitCode != 0 || out.String() != "again\n" {
			t.Fatalf("exec %d after a restart: %+v %v %q", i, st, err, out.String())
		}
	}
}
