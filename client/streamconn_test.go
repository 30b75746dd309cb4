package client

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"paddock/api"
	"paddock/wire"
)

// streamDaemon serves /v1/sandboxes/{id}/exec on a unix socket: "quick"
// answers "hi" and exit 0 at once, "slow" says "hi" and then waits for
// release. It counts the connections it has accepted.
type streamDaemon struct {
	srv     *http.Server
	host    string
	conns   atomic.Int32
	release chan struct{}
}

func startStreamDaemon(t *testing.T) *streamDaemon {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	d := &streamDaemon{host: "unix://" + sock, release: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", api.StreamContentType)
		w.Header().Set("X-Paddock-Pid", "7")
		fw := wire.NewWriter(w)
		fw.Write(wire.Stdout, []byte("hi"))
		if r.PathValue("id") == "slow" {
			http.NewResponseController(w).Flush()
			select {
			case <-d.release:
			case <-r.Context().Done():
				return
			}
		}
		fw.WriteJSON(wire.Exit, api.ExitStatus{ExitCode: 3})
	})
	d.srv = &http.Server{Handler: mux, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			d.conns.Add(1)
		}
	}}
	go d.srv.Serve(ln)
	t.Cleanup(func() { d.srv.Close() })
	return d
}

func TestStreamsReuseTheirConnection(t *testing.T) {
	d := startStreamDaemon(t)
	c, err := New(d.host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for i := range 5 {
		var out strings.Builder
		st, err := c.Exec(ctx, "quick", api.ExecRequest{Cmd: []string{"x"}}, ExecIO{Stdout: &out})
		if err != nil || st.ExitCode != 3 || out.String() != "hi" {
			t.Fatalf("exec %d: %+v %v %q", i, st, err, out.String())
		}
	}
	if n := d.conns.Load(); n != 1 {
		t.Errorf("5 execs in turn used %d connections, want 1", n)
	}
}

// A kept connection the daemon has closed (it restarted, say) is not
// used: the next stream works on a new one.
func TestStreamsSkipAConnectionTheDaemonClosed(t *testing.T) {
	d := startStreamDaemon(t)
	c, _ := New(d.host)
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Exec(ctx, "quick", api.ExecRequest{Cmd: []string{"x"}}, ExecIO{}); err != nil {
		t.Fatal(err)
	}
	d.srv.SetKeepAlivesEnabled(false) // closes the idle connection
	kept := c.streams.idle[0].Conn
	for deadline := time.Now().Add(5 * time.Second); open(kept) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if open(kept) {
		t.Fatal("the daemon did not close the kept connection")
	}
	d.srv.SetKeepAlivesEnabled(true)
	st, err := c.Exec(ctx, "quick", api.ExecRequest{Cmd: []string{"x"}}, ExecIO{})
	if err != nil || st.ExitCode != 3 {
		t.Fatalf("exec after the daemon closed the kept connection: %+v %v", st, err)
	}
	if n := d.conns.Load(); n != 2 {
		t.Errorf("used %d connections, want 2", n)
	}
}

// Closing a stream that is still running returns at once and does not
// keep its connection; a cancelled context ends a stream's wait.
func TestStreamsCloseAndCancel(t *testing.T) {
	d := startStreamDaemon(t)
	defer close(d.release)
	c, _ := New(d.host)
	defer c.Close()
	s, err := c.ExecStream(context.Background(), "slow", api.ExecRequest{Cmd: []string{"x"}}, false)
	if err != nil || s.PID != 7 {
		t.Fatalf("stream: %+v %v", s, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close of a running stream blocked")
	}
	if len(c.streams.idle) != 0 {
		t.Errorf("a stream closed before its end left %d kept connections", len(c.streams.idle))
	}

	ctx, cancel := context.WithCancel(context.Background())
	s, err = c.ExecStream(ctx, "slow", api.ExecRequest{Cmd: []string{"x"}}, false)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var werr error
	go func() {
		defer wg.Done()
		_, werr = s.Wait(nil, nil)
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	wg.Wait()
	if werr == nil {
		t.Fatal("Wait returned no error after its context was cancelled")
	}
	s.Close()
	if len(c.streams.idle) != 0 {
		t.Errorf("a cancelled stream left %d kept connections", len(c.streams.idle))
	}
	if _, err := c.Exec(context.Background(), "quick", api.ExecRequest{Cmd: []string{"x"}}, ExecIO{}); err != nil {
		t.Fatalf("exec after a cancel: %v", err)
	}
}
