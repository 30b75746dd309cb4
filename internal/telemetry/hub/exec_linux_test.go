package hub

import (
	"context"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/guestapi"
	"github.com/paddock-dev/paddock/internal/guestapi/guestapitest"
	"github.com/paddock-dev/paddock/internal/telemetry/admission"
	"github.com/paddock-dev/paddock/internal/telemetry/execlog"
	"github.com/paddock-dev/paddock/wire"
)

// fakeGuest answers attach requests on a unix socket as the guest does;
// each attach's stream is handed to the test on streams.
type fakeGuest struct {
	path    string
	streams chan stream
}

// stream is one attach's connection, as the guest writes it.
type stream struct {
	*wire.Writer
	conn net.Conn
}

func newFakeGuest(t *testing.T) *fakeGuest {
	t.Helper()
	g := &fakeGuest{path: filepath.Join(t.TempDir(), "guest.sock"), streams: make(chan stream, 256)}
	l, err := net.Listen("unix", g.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { conn.Close() })
			go func() {
				w, _, err := guestapitest.AcceptAttach(conn)
				if err != nil {
					conn.Close()
					return
				}
				g.streams <- stream{Writer: w, conn: conn}
			}()
		}
	}()
	return g
}

func (g *fakeGuest) client() *guestapi.Client {
	return guestapi.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", g.path)
	})
}

// waitExit waits for the exit of process seq of sandbox id in the log.
func waitExit(t *testing.T, h *Hub, id string) execlog.Process {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ps, err := h.execs.List(id)
		if err == nil && len(ps) == 1 && ps[0].Exit != nil {
			return ps[0]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no exit recorded for %s", id)
	return execlog.Process{}
}

func output(t *testing.T, h *Hub, id string, seq uint64) string {
	t.Helper()
	var out []byte
	err := h.execs.Read(context.Background(), id, seq, 0, false, func(c execlog.Chunk) error {
		out = append(out, c.Data...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestExecCopyFollowsQuietProcesses detaches many copies, so that each
// follows its process on a connection of its own, and checks that the
// quiet ones hold no goroutine each, and that output written between
// long silences and the exit reach the log whole.
func TestExecCopyFollowsQuietProcesses(t *testing.T) {
	h, err := New(Config{Dir: t.TempDir(), Capacity: admission.Resources{CPUs: 4, MemoryBytes: 2 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if h.notify == nil {
		t.Fatal("the hub has no notifier")
	}
	g := newFakeGuest(t)
	gc := g.client()
	const n = 100
	base := runtime.NumGoroutine()
	ids := make([]string, n)
	for i := range n {
		ids[i] = "quiet" + string(rune('a'+i/26)) + string(rune('a'+i%26))
		c := h.ExecStarted(ids[i], "", gc, 100+i, []string{"sleep", "3600"})
		c.Detach()
	}
	streams := make([]stream, n)
	for i := range n {
		select {
		case streams[i] = <-g.streams:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d copies attached", i, n)
		}
	}
	// The record is saved within batchDelay; then every copy is idle.
	time.Sleep(batchDelay + 500*time.Millisecond)
	runtime.GC()
	// The fake guest's side holds none (its goroutines have returned).
	if got := runtime.NumGoroutine() - base; got > 10 {
		t.Fatalf("%d goroutines for %d idle copies", got, n)
	}
	// Output after the silence, a second silence past a batch, the exit.
	// The attach answers do not say which stream is whose: the pids are
	// what the log keeps, so write each its own.
	for _, w := range streams {
		w.Write(wire.Stdout, []byte("hello "))
	}
	time.Sleep(batchDelay + 200*time.Millisecond)
	for _, w := range streams {
		w.Write(wire.Stderr, []byte("world"))
		w.WriteJSON(wire.Exit, api.ExitStatus{ExitCode: 3})
	}
	for _, id := range ids {
		p := waitExit(t, h, id)
		if p.Exit.ExitCode != 3 || p.End != 11 {
			t.Fatalf("%s: exit %+v, end %d", id, p.Exit, p.End)
		}
		if out := output(t, h, id, p.Seq); out != "hello world" {
			t.Fatalf("%s: output %q", id, out)
		}
	}
}

// TestExecCopyStreamLost: a stream that ends without an exit (the guest
// gone) while the copy is parked is recorded as lost, with the output
// before it.
func TestExecCopyStreamLost(t *testing.T) {
	h, err := New(Config{Dir: t.TempDir(), Capacity: admission.Resources{CPUs: 4, MemoryBytes: 2 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	g := newFakeGuest(t)
	h.ExecStarted("lost1", "", g.client(), 9, []string{"sleep", "3600"}).Detach()
	s := <-g.streams
	time.Sleep(200 * time.Millisecond)
	s.Write(wire.Stdout, []byte("partial"))
	time.Sleep(batchDelay + 200*time.Millisecond)
	s.conn.Close()
	p := waitExit(t, h, "lost1")
	if p.Exit.ExitCode != -1 || !strings.HasPrefix(p.Exit.Error, "lost the process") {
		t.Fatalf("exit %+v", p.Exit)
	}
	if out := output(t, h, "lost1", p.Seq); out != "partial" {
		t.Fatalf("output %q", out)
	}
}

// TestExecCopyStopsWithTheHub: a parked copy ends when the hub closes,
// with its record left open for the next daemon to resume.
func TestExecCopyStopsWithTheHub(t *testing.T) {
	dir := t.TempDir()
	h, err := New(Config{Dir: dir, Capacity: admission.Resources{CPUs: 4, MemoryBytes: 2 << 30}})
	if err != nil {
		t.Fatal(err)
	}
	g := newFakeGuest(t)
	h.ExecStarted("stop1", "", g.client(), 5, []string{"sleep", "3600"}).Detach()
	s := <-g.streams
	s.Write(wire.Stdout, []byte("kept"))
	time.Sleep(batchDelay + 300*time.Millisecond)
	done := make(chan struct{})
	go func() {
		h.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a copy parked")
	}
	ps, err := h.execs.List("stop1")
	if err != nil || len(ps) != 1 || ps[0].Exit != nil || ps[0].End != 4 {
		t.Fatalf("after Close: %+v %v", ps, err)
	}
}
