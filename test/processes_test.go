package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
	"github.com/paddock-dev/paddock/wire"
)

// waitState polls a process until it reaches state (bounded).
func waitState(t *testing.T, c *client.Client, id string, pid int, state string) *api.Process {
	t.Helper()
	var p *api.Process
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		p, err = c.Process(context.Background(), id, pid)
		if err == nil && p.State == state {
			return p
		}
	}
	t.Fatalf("process %d: state %v (%v), want %s", pid, p, err, state)
	return nil
}

func TestProcessesBackgroundAndAttach(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})

	// A background process with stdin open: feed it, close it, read all.
	p, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sh", "-c", "tr a-z A-Z; echo done >&2; exit 5"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.PID <= 1 || p.State != "running" {
		t.Fatalf("started %+v", p)
	}
	if err := c.SendInputBytes(ctx, id, p.PID, []byte("hello "), false); err != nil {
		t.Fatal(err)
	}
	if err := c.SendInputBytes(ctx, id, p.PID, []byte("world\n"), true); err != nil {
		t.Fatal(err)
	}
	fin := waitState(t, c, id, p.PID, "exited")
	if fin.Exit == nil || fin.Exit.ExitCode != 5 {
		t.Fatalf("exit %+v, want 5", fin.Exit)
	}
	// It finished while nobody was attached: attach replays everything.
	s, err := c.Attach(ctx, id, p.PID, client.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	st, err := s.Wait(&out, &errb)
	s.Close()
	if err != nil || st.ExitCode != 5 || out.String() != "HELLO WORLD\n" || errb.String() != "done\n" {
		t.Fatalf("replay: %q %q %+v %v", out.String(), errb.String(), st, err)
	}
	// From an offset: only the rest. Offsets count stdout and stderr
	// together, in the order the guest read them (the two pipes may
	// interleave either way).
	combined := func(off int64) string {
		s, err := c.Attach(ctx, id, p.PID, client.AttachOptions{Offset: off})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var all bytes.Buffer
		s.Wait(&all, &all)
		return all.String()
	}
	whole := combined(0)
	if len(whole) != len("HELLO WORLD\ndone\n") {
		t.Fatalf("combined replay %q", whole)
	}
	if got := combined(6); got != whole[6:] {
		t.Fatalf("replay from 6: %q, want %q", got, whole[6:])
	}

	// ps lists it with its exit; attach through the CLI exits with its code.
	if o := d.MustCLI("ps", id); !strings.Contains(o, strconv.Itoa(p.PID)) || !strings.Contains(o, "exited") {
		t.Fatalf("ps: %s", o)
	}
	if r := d.CLI("attach", id, strconv.Itoa(p.PID)); r.Code != 5 || r.Stdout != "HELLO WORLD\n" {
		t.Fatalf("attach: %+v", r)
	}

	// Errors: unknown pid 404, bad pid 400, input to a finished process
	// 409, a missing command or cwd 400 naming it.
	if _, err := c.Process(ctx, id, 99999); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("unknown pid: %v", err)
	}
	if r := d.CLI("attach", id, "abc"); r.Code == 0 {
		t.Fatal("attach to a non-numeric pid succeeded")
	}
	if err := c.SendInputBytes(ctx, id, p.PID, []byte("x"), false); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("input to a finished process: %v", err)
	}
	if _, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"no-such-command"}}); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("starting a missing command: %v", err)
	}
	if _, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"true"}, Cwd: "/no/such/dir"}); !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "cwd") {
		t.Fatalf("starting in a missing cwd: %v", err)
	}
}

func TestProcessSignalsUserAndTimeout(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})

	p, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := d.CLI("kill", id, strconv.Itoa(p.PID), "TERM"); r.Code != 0 {
		t.Fatalf("kill: %+v", r)
	}
	fin := waitState(t, c, id, p.PID, "exited")
	if fin.Exit.Signal != "SIGTERM" || fin.Exit.ExitCode != 143 {
		t.Fatalf("after TERM: %+v", fin.Exit)
	}
	if err := c.Signal(ctx, id, p.PID, "NOSUCHSIG"); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("bad signal: %v", err)
	}

	// A lifetime: killed and reported as timed out.
	p, err = c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sleep", "300"}, TimeoutSeconds: 1})
	if err != nil {
		t.Fatal(err)
	}
	fin = waitState(t, c, id, p.PID, "exited")
	if !fin.Exit.TimedOut || fin.Exit.Signal != "SIGKILL" {
		t.Fatalf("after timeout: %+v", fin.Exit)
	}

	// As another user.
	out, _, st := d.ExecAs(id, "user", "id", "-un")
	if st.ExitCode != 0 || strings.TrimSpace(out) != "user" {
		t.Fatalf("id -un as user: %q %+v", out, st)
	}
	out, _, _ = d.ExecAs(id, "user", "sh", "-c", "echo $HOME")
	if strings.TrimSpace(out) != "/home/user" {
		t.Fatalf("HOME as user: %q", out)
	}
}

func TestReattachAfterDropAndRestart(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})

	// A process that writes numbered lines for a while.
	p, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sh", "-c", "i=0; while [ $i -lt 40 ]; do echo line$i; i=$((i+1)); sleep 0.05; done"}})
	if err != nil {
		t.Fatal(err)
	}
	// Attach, read a little, drop the connection.
	actx, cancel := context.WithCancel(ctx)
	s, err := c.Attach(actx, id, p.PID, client.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := &lineWriter{stop: 3, cancel: cancel}
	s.Wait(first, io.Discard)
	s.Close()
	off := s.Offset()
	if off == 0 {
		t.Fatal("read nothing before dropping")
	}

	// Kill the daemon while the process runs, restart it, resume from
	// the offset: the rest arrives, nothing twice, nothing missing.
	d.Kill9()
	d.Start()
	c = d.Client()
	s, err = c.Attach(ctx, id, p.PID, client.AttachOptions{Offset: off})
	if err != nil {
		t.Fatal(err)
	}
	var rest bytes.Buffer
	st, err := s.Wait(&rest, io.Discard)
	s.Close()
	if err != nil || st.ExitCode != 0 {
		t.Fatalf("after restart: %+v %v", st, err)
	}
	all := first.String()[:off] + rest.String()
	var want strings.Builder
	for i := 0; i < 40; i++ {
		want.WriteString("line" + strconv.Itoa(i) + "\n")
	}
	if all != want.String() {
		t.Fatalf("output across drop and restart:\n%q\nwant\n%q", all, want.String())
	}
}

// lineWriter cancels after stop newlines.
type lineWriter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	stop   int
	cancel func()
}

func (w *lineWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if bytes.Count(w.buf.Bytes(), []byte("\n")) >= w.stop {
		w.cancel()
	}
	return len(b), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestStreamsEndWhenSandboxIsKilled(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})
	s, err := c.ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"sleep", "300"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res := make(chan *api.ExitStatus, 1)
	go func() {
		st, _ := s.Wait(io.Discard, io.Discard)
		res <- st
	}()
	time.Sleep(100 * time.Millisecond)
	if err := c.Delete(ctx, id, true); err != nil {
		t.Fatal(err)
	}
	select {
	case st := <-res:
		if st == nil || st.Error != "sandbox ended" {
			t.Fatalf("stream ended with %+v, want \"sandbox ended\"", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stream still open 10s after the sandbox was removed")
	}
}

func TestOutputRetentionCap(t *testing.T) {
	d := StartDaemon(t, "--output-limit", "65536")
	c := d.Client()
	ctx := context.Background()
	id := d.Create(api.CreateRequest{})
	p, err := c.StartProcess(ctx, id, api.StartRequest{Cmd: []string{"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x"}})
	if err != nil {
		t.Fatal(err)
	}
	fin := waitState(t, c, id, p.PID, "exited")
	if fin.OutputBytes != 300000 || fin.DroppedBytes < 300000-65536 {
		t.Fatalf("output %d dropped %d", fin.OutputBytes, fin.DroppedBytes)
	}
	s, err := c.Attach(ctx, id, p.PID, client.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s.Wait(&out, io.Discard)
	s.Close()
	if int64(out.Len()) != 300000-fin.DroppedBytes || s.Offset() != 300000 {
		t.Fatalf("replay %d bytes, offset %d (dropped %d)", out.Len(), s.Offset(), fin.DroppedBytes)
	}
}

// TestPTY drives `paddock shell` and `paddock exec -it` from a real
// pseudo-terminal: type into bash and python, resize, read stty size.
func TestPTY(t *testing.T) {
	d := StartDaemon(t)
	id := d.Create(api.CreateRequest{})

	sh := startTerminal(t, d, 100, 30, "shell", id)
	sh.expect("# ")
	sh.send("stty size\r")
	sh.expect("30 100")
	sh.resize(120, 40)
	sh.send("stty size\r")
	sh.expect("40 120")
	sh.send("echo $TERM; tty\r")
	sh.expect("/dev/pts/")
	sh.send("exit 3\r")
	if code := sh.wait(); code != 3 {
		t.Fatalf("shell exit code %d, want 3", code)
	}

	py := startTerminal(t, d, 80, 24, "exec", "-it", id, "--", "python3", "-i", "-q")
	py.expect(">>> ")
	py.send("print(6*7)\r")
	py.expect("42")
	py.send("\x04") // ^D ends the interpreter
	if code := py.wait(); code != 0 {
		t.Fatalf("python exit code %d", code)
	}
}

type terminal struct {
	t   *testing.T
	f   *os.File
	cmd *exec.Cmd
	mu  sync.Mutex
	buf bytes.Buffer
}

func startTerminal(t *testing.T, d *Daemon, cols, rows uint16, args ...string) *terminal {
	t.Helper()
	cmd := exec.Command(paddockBin, append([]string{"--host", d.Host}, args...)...)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: cols, Rows: rows})
	if err != nil {
		t.Fatal(err)
	}
	term := &terminal{t: t, f: f, cmd: cmd}
	t.Cleanup(func() { cmd.Process.Kill(); f.Close() })
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := f.Read(b)
			term.mu.Lock()
			term.buf.Write(b[:n])
			term.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return term
}

func (term *terminal) expect(s string) {
	term.t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		term.mu.Lock()
		got := term.buf.String()
		i := strings.Index(got, s)
		if i >= 0 {
			term.buf.Next(i + len(s))
		}
		term.mu.Unlock()
		if i >= 0 {
			return
		}
	}
	term.mu.Lock()
	defer term.mu.Unlock()
	term.t.Fatalf("terminal never showed %q; it shows:\n%q", s, term.buf.String())
}

func (term *terminal) send(s string) {
	if _, err := term.f.Write([]byte(s)); err != nil {
		term.t.Fatal(err)
	}
}

func (term *terminal) resize(cols, rows uint16) {
	// The CLI learns of a resize from SIGWINCH, as with a real terminal.
	pty.Setsize(term.f, &pty.Winsize{Cols: cols, Rows: rows})
	term.cmd.Process.Signal(syscall.SIGWINCH)
	time.Sleep(200 * time.Millisecond)
}

func (term *terminal) wait() int {
	done := make(chan error, 1)
	go func() { done <- term.cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			term.t.Fatal(err)
		}
		return 0
	case <-time.After(15 * time.Second):
		term.t.Fatal("CLI did not exit")
		return -1
	}
}

// TestOrphansAreReaped: the guest is the sandbox's PID 1, so a process
// whose parent has exited becomes its child and must be reaped when it
// ends, or it stays a zombie holding a pid. A command that says nothing
// still answers its start at once, and its exit status is its own.
func TestOrphansAreReaped(t *testing.T) {
	d := StartDaemon(t)
	c := d.Client()
	id := d.Create(api.CreateRequest{})

	// The subshell outlives sh: it is reparented to PID 1, then exits.
	d.Sh(id, `(echo $(sh -c 'echo $PPID') > /tmp/orphan; sleep 1; exit 7) > /dev/null 2>&1 &`)
	var pid string
	for deadline := time.Now().Add(10 * time.Second); pid == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		pid = strings.TrimSpace(d.Sh(id, "cat /tmp/orphan 2>/dev/null || true"))
	}
	if pid == "" {
		t.Fatal("the background subshell never wrote its pid")
	}
	if ppid := d.Sh(id, "awk '{print $4}' /proc/"+pid+"/stat"); strings.TrimSpace(ppid) != "1" {
		t.Fatalf("orphan %s has parent %q, want 1 (the guest)", pid, ppid)
	}
	var state string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		state = strings.TrimSpace(d.Sh(id, "awk '{print $3}' /proc/"+pid+"/stat 2>/dev/null || echo gone"))
		if state == "gone" {
			break
		}
	}
	if state != "gone" {
		t.Fatalf("orphan %s is still in /proc in state %q after it exited", pid, state)
	}

	// A silent command's start is answered while it runs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.ExecStream(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 30; exit 3"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.PID <= 1 {
		t.Fatalf("start answered with pid %d", s.PID)
	}
	if err := c.Signal(context.Background(), id, s.PID, "TERM"); err != nil {
		t.Fatal(err)
	}
	st, err := s.Wait(io.Discard, io.Discard)
	if err != nil || st == nil || st.Signal != "SIGTERM" {
		t.Fatalf("after SIGTERM: %+v %v", st, err)
	}
}

// TestExecWholeAnswer: a command that is done before the guest answers
// (one that says nothing: the answer waits for its first output or its
// exit) gets its whole stream in one body with a length; one that takes
// longer is streamed chunked; both are in the exec log with their output
// and exit.
func TestExecWholeAnswer(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	for _, tc := range []struct {
		name, script string
		whole        bool
		out, errOut  string
		code         int
	}{
		{"short", "exit 4", true, "", "", 4},
		{"streamed", "echo a; sleep 0.3; echo b >&2", false, "a\n", "b\n", 0},
	} {
		body, _ := json.Marshal(api.ExecRequest{Cmd: []string{"sh", "-c", tc.script}})
		var a httpAnswer
		// The guest holds a silent command's answer for 5 ms at most: on a
		// loaded machine sh may take longer (a bare spawn and wait of
		// /bin/true took 3 ms on this host's slow days, more under the
		// suite's load), and its answer then comes alone. One whole answer
		// in some tries is the property.
		for try := 0; try < 30; try++ {
			a = d.do("POST", "/v1/sandboxes/"+id+"/exec", string(body))
			if a.Status != 200 {
				t.Fatalf("%s: status %d: %s", tc.name, a.Status, a.Body)
			}
			if !tc.whole || a.Header.Get("Content-Length") != "" {
				break
			}
		}
		if got := a.Header.Get("Content-Length") != ""; got != tc.whole {
			t.Errorf("%s: a body with a length: %v, want %v", tc.name, got, tc.whole)
		}
		var out, errOut strings.Builder
		var st api.ExitStatus
		fr := wire.NewReader(bytes.NewReader(a.Body))
		for {
			f, err := fr.Read()
			if err != nil {
				break
			}
			switch f.Type {
			case wire.Stdout:
				out.Write(f.Payload)
			case wire.Stderr:
				errOut.Write(f.Payload)
			case wire.Exit:
				json.Unmarshal(f.Payload, &st)
			}
		}
		if out.String() != tc.out || errOut.String() != tc.errOut || st.ExitCode != tc.code {
			t.Errorf("%s: stdout %q, stderr %q, exit %d; want %q, %q, %d", tc.name, out.String(), errOut.String(), st.ExitCode, tc.out, tc.errOut, tc.code)
		}
		pid, _ := strconv.Atoi(a.Header.Get("X-Paddock-Pid"))
		want := int64(len(tc.out) + len(tc.errOut))
		if !waitFor(10*time.Second, 20*time.Millisecond, func() bool {
			ls, _ := d.Client().Logs(context.Background(), id)
			for _, l := range ls {
				if l.PID == pid && l.Exit != nil && l.Exit.ExitCode == tc.code && l.End == want {
					return true
				}
			}
			return false
		}) {
			ls, _ := d.Client().Logs(context.Background(), id)
			t.Errorf("%s: pid %d with exit %d and %d bytes is not in the exec log: %+v", tc.name, pid, tc.code, want, ls)
		}
	}
}

// TestMonitorSlack: the Go runtime's monitor thread of the guest (thread
// 2 of the sandbox's PID namespace) and of the daemon (its first thread)
// sleep with a 2 ms timer slack, which keeps them from waking every 20-70
// µs around each exec; the guest's main thread and the processes of the
// sandbox have the kernel's default slack.
func TestMonitorSlack(t *testing.T) {
	t.Parallel()
	d := newDaemon(t)
	id := d.Create(api.CreateRequest{})
	slack := func(tid string) string {
		b, err := os.ReadFile("/proc/" + tid + "/timerslack_ns")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	// Threads by their id here or, with inner set, in their innermost PID
	// namespace.
	threads := func(pid int, inner bool) map[int]string {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		byID := map[int]string{}
		for _, task := range tasks {
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
			if err != nil {
				continue // exited meanwhile
			}
			n, _ := strconv.Atoi(task.Name())
			for _, l := range lines(string(status)) {
				if ids, ok := strings.CutPrefix(l, "NSpid:"); ok && inner {
					f := strings.Fields(ids)
					n, _ = strconv.Atoi(f[len(f)-1])
				}
			}
			byID[n] = slack(task.Name())
		}
		return byID
	}
	// The guest starts as the fast guest (C): its two threads, and what
	// it starts, have the kernel's default.
	pid := d.hostPID(id)
	guest := threads(pid, true)
	if len(guest) != 2 || guest[1] != "50000" {
		t.Errorf("the fast guest's threads: %v, want two with the kernel's default 50000 ns", guest)
	}
	for _, v := range guest {
		if v != "50000" {
			t.Errorf("a thread of the fast guest has slack %s ns, want the kernel's default 50000; all: %v", v, guest)
		}
	}
	if got := strings.TrimSpace(d.Sh(id, "cat /proc/self/timerslack_ns")); got != "50000" {
		t.Errorf("a process in the sandbox has slack %q ns, want the kernel's default 50000", got)
	}
	// A process list is the Go guest's: the fast guest hands over, and
	// execs the Go guest with the monitor's slack. Its main thread (1)
	// takes the default back; the runtime's monitor, the first thread
	// it starts, keeps 2 ms.
	if _, err := d.Client().Processes(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	guest = threads(pid, true)
	monitor := 0
	for tid := range guest {
		if tid > 1 && (monitor == 0 || tid < monitor) {
			monitor = tid
		}
	}
	if len(guest) < 3 || guest[monitor] != "2000000" {
		t.Errorf("the Go guest's thread %d (the runtime's monitor): slack %q ns, want 2000000; all: %v", monitor, guest[monitor], guest)
	}
	if guest[1] != "50000" {
		t.Errorf("the Go guest's main thread: slack %q ns, want the kernel's default 50000; all: %v", guest[1], guest)
	}
	if got := strings.TrimSpace(d.Sh(id, "cat /proc/self/timerslack_ns")); got != "50000" {
		t.Errorf("a process the Go guest started has slack %q ns, want the kernel's default 50000", got)
	}
	daemonPID := d.cmd.Process.Pid
	daemon := threads(daemonPID, false)
	first := 0
	for tid := range daemon {
		if tid > daemonPID && (first == 0 || tid < first) {
			first = tid
		}
	}
	if daemon[first] != "2000000" {
		t.Errorf("daemon's first thread %d (the runtime's monitor): slack %q ns, want 2000000; all: %v", first, daemon[first], daemon)
	}
}
