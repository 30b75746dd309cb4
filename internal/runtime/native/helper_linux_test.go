package native

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/guestfork"
)

// helperProc is a fast guest's helper as the host sees it.
type helperProc struct{ hostPID, pid int }

// procExists reports whether host process pid exists, a zombie too: it
// is gone once its parent reaped it.
func procExists(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// helpers lists the children of guest pid that run the helper verb.
func helpers(t *testing.T, pid int) []helperProc {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var hs []helperProc
	for _, task := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
		for _, f := range strings.Fields(string(b)) {
			c, _ := strconv.Atoi(f)
			argv, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c))
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", c))
			if args := strings.Split(string(argv), "\x00"); len(args) < 2 || args[1] != guestfork.HelperVerb || strings.Contains(string(st), "State:\tZ") {
				continue
			}
			h := helperProc{hostPID: c}
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
					ids := strings.Fields(v)
					h.pid, _ = strconv.Atoi(ids[len(ids)-1])
				}
			}
			hs = append(hs, h)
		}
	}
	return hs
}

// shIn runs sh -c script in the sandbox through the fast guest and
// returns its stdout and stderr and exit code.
func shIn(t *testing.T, g *guestapi.Client, script string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, c, err := g.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out, errs, st := readStream(t, c, "")
	return out, errs, st.ExitCode
}

func writeFile(t *testing.T, g *guestapi.Client, path, content string) {
	t.Helper()
	if _, err := g.WriteFile(context.Background(), guestapi.FileRequest{Path: path}, strings.NewReader(content)); err != nil {
		t.Fatalf("writing %s: %v", path, err)
	}
}

func readFile(t *testing.T, g *guestapi.Client, path string) string {
	t.Helper()
	_, ds, err := g.ReadFile(context.Background(), guestapi.FileRequest{Path: path})
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	defer ds.Close()
	b, err := io.ReadAll(ds)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return string(b)
}

// TestFastGuestHelper: the fast guest passes file ops and port
// connections on to its helper (the Go guest's binary in its helper
// verb, a child of PID 1) and the sandbox stays on the fast guest: each
// file op and a port connection are served, PID 1 keeps its two threads.
// The sandbox's processes cannot read the helper's memory or descriptors;
// one that kills it only ends the ops it was serving, and the next op
// starts another. A watch the helper serves goes on across a handover to
// the Go guest, which serves the ops after it, and the helper leaves once
// the watch ends, reaped.
func TestFastGuestHelper(t *testing.T) {
	t.Parallel()
	g, pid := guestInstance(t, fastGuest(t), true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	onFast := func(what string) {
		t.Helper()
		if n := threadCount(t, pid); n != 2 {
			t.Fatalf("the guest runs %d threads after %s: the fast guest handed over", n, what)
		}
	}
	if hs := helpers(t, pid); len(hs) != 0 {
		t.Fatalf("helpers before any file op: %+v", hs)
	}

	writeFile(t, g, "/tmp/a.txt", "hello\n")
	if got := readFile(t, g, "/tmp/a.txt"); got != "hello\n" {
		t.Fatalf("read back %q", got)
	}
	if out, _, _ := shIn(t, g, "cat /tmp/a.txt"); out != "hello\n" {
		t.Fatalf("the sandbox reads %q from the file the helper wrote", out)
	}
	mode := api.FileMode(0o700)
	if fi, err := g.Mkdir(ctx, guestapi.FileRequest{Path: "d/e", Parents: true, Mode: &mode}); err != nil || fi.Path != "/d/e" || fi.Type != "dir" {
		t.Fatalf("mkdir relative to the workdir: %+v, %v", fi, err)
	}
	if fi, err := g.Move(ctx, guestapi.FileRequest{Path: "/tmp/a.txt", To: "/d/e/b.txt"}); err != nil || fi.Size != 6 {
		t.Fatalf("move: %+v, %v", fi, err)
	}
	ls, err := g.ListDir(ctx, guestapi.FileRequest{Path: "/d", Depth: 2})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for {
		batch, err := ls.Next()
		if err != nil {
			break
		}
		for _, fi := range batch {
			names = append(names, fi.Path)
		}
	}
	ls.Close()
	if strings.Join(names, " ") != "/d/e /d/e/b.txt" {
		t.Fatalf("list of /d: %q", names)
	}
	var tb bytes.Buffer
	ts, err := g.TarGet(ctx, guestapi.FileRequest{Path: "/d"})
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(&tb, ts)
	ts.Close()
	if _, err := g.TarPut(ctx, guestapi.FileRequest{Path: "/copy"}, &tb); err != nil {
		t.Fatalf("tar put of the tar got: %v", err)
	}
	if got := readFile(t, g, "/copy/d/e/b.txt"); got != "hello\n" {
		t.Fatalf("the tar's round trip: %q", got)
	}
	if err := g.Remove(ctx, guestapi.FileRequest{Path: "/copy", Recursive: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Stat(ctx, guestapi.FileRequest{Path: "/copy"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat after remove: %v", err)
	}
	// Hostile paths get the Go guest's answers: nothing outside the root.
	if _, err := g.Stat(ctx, guestapi.FileRequest{Path: "/proc/1/root/etc"}); err == nil {
		t.Fatal("stat through /proc/1/root succeeded")
	}
	onFast("file ops")

	// A port connection.
	listen := `import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7321))
s.listen()
print("up", flush=True)
c, _ = s.accept()
c.sendall(c.recv(64).upper())
`
	_, pc, err := g.StartAttached(ctx, &guestapi.StartRequest{Cmd: []string{"python3", "-c", listen}, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	readStream(t, pc, "up\n")
	conn, err := g.DialPort(ctx, 7321)
	if err != nil {
		t.Fatalf("a port connection: %v", err)
	}
	conn.Write([]byte("ping"))
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	got, _ := io.ReadAll(conn)
	conn.Close()
	if string(got) != "PING" {
		t.Fatalf("through the port connection: %q", got)
	}
	onFast("a port connection")

	hs := helpers(t, pid)
	if len(hs) != 1 {
		t.Fatalf("helpers: %+v", hs)
	}
	// Root in the sandbox cannot read the helper's memory, environment
	// or descriptors (not dumpable, no CAP_SYS_PTRACE), as it cannot PID
	// 1's; it can kill it.
	h := hs[0]
	for _, p := range []int{1, h.pid} {
		for _, probe := range []string{"cat /proc/%d/environ", "readlink /proc/%d/fd/0", "cat /proc/%d/fd/3 </dev/null", "head -c 1 /proc/%d/mem", "readlink /proc/%d/exe"} {
			if out, _, code := shIn(t, g, fmt.Sprintf(probe, p)); code == 0 {
				t.Errorf("the sandbox ran %q: %q", fmt.Sprintf(probe, p), out)
			}
		}
	}
	if _, errs, code := shIn(t, g, fmt.Sprintf("kill -9 %d", h.pid)); code != 0 {
		t.Fatalf("kill -9 of the helper from the sandbox: %s", errs)
	}
	// Reaped, not only dying: a helper whose memory is gone no longer
	// shows in helpers, but its socket closes later in its exit, and an
	// op passed to it before then is lost with it. PID 1 reaps it after
	// that, and forgets its socket as it does.
	for i := 0; len(helpers(t, pid)) != 0 || procExists(h.hostPID); i++ {
		if i == 100 {
			t.Fatal("the killed helper was not reaped")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := g.Stat(ctx, guestapi.FileRequest{Path: "/d/e/b.txt"}); err != nil {
		t.Fatalf("stat after the helper was killed: %v", err)
	}
	if hs := helpers(t, pid); len(hs) != 1 || hs[0].hostPID == h.hostPID {
		t.Fatalf("helpers after one was killed: %+v (the killed %+v)", hs, h)
	}
	onFast("the helper's kill")

	// A watch across a handover.
	w, err := g.Watch(ctx, guestapi.FileRequest{Path: "/d/e"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	helper := helpers(t, pid)[0]
	if _, err := g.Processes(ctx); err != nil {
		t.Fatalf("list (the handover): %v", err)
	}
	if n := threadCount(t, pid); n <= 2 {
		t.Fatalf("the guest runs %d threads after the list: no handover", n)
	}
	writeFile(t, g, "/d/e/c.txt", "c")
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("the watch after the handover: %v", err)
		}
		if ev.Path == "/d/e/c.txt" {
			break
		}
	}
	if hs := helpers(t, pid); len(hs) != 1 || hs[0] != helper {
		t.Fatalf("helpers after the handover, which serves the ops that follow itself: %+v (before: %+v)", hs, helper)
	}
	w.Close()
	// It leaves and the Go guest reaps it.
	for i := 0; ; i++ {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(helper.hostPID))); err != nil {
			break
		}
		if i == 250 {
			st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", helper.hostPID))
			t.Fatalf("the helper is still there after its watch ended and its fast guest handed over:\n%s", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
