package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/netpipe"
	"github.com/paddock-dev/paddock/wire"
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
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.VersionInfo{Version: strings.Repeat("v", 10000)})
	})
	mux.HandleFunc("POST /reject", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "too large", http.StatusRequestEntityTooLarge)
	})
	mux.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, n)
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

// client returns an SDK client of d, closed when the test ends.
func (d *streamDaemon) client(t *testing.T) *Client {
	c, err := New(d.host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestStreamsReuseTheirConnection(t *testing.T) {
	d := startStreamDaemon(t)
	c := d.client(t)
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
	c := d.client(t)
	ctx := context.Background()
	if _, err := c.Exec(ctx, "quick", api.ExecRequest{Cmd: []string{"x"}}, ExecIO{}); err != nil {
		t.Fatal(err)
	}
	d.srv.SetKeepAlivesEnabled(false) // closes the idle connection
	kept := c.tr.idle[0].Conn
	for deadline := time.Now().Add(5 * time.Second); netpipe.Alive(kept) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if netpipe.Alive(kept) {
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
	c := d.client(t)
	s, err := c.ExecStream(context.Background(), "slow", api.ExecRequest{Cmd: []string{"x"}}, false)
	if err != nil || s.PID != 7 {
		t.Fatalf("stream: %+v %v", s, err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := s.Wait(nil, nil)
		waited <- err
	}()
	time.Sleep(20 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- s.Close() }() // while Wait reads
	for _, ch := range []chan error{done, waited} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("Close of a running stream, or the Wait reading it, blocked")
		}
	}
	if len(c.tr.idle) != 0 {
		t.Errorf("a stream closed before its end left %d kept connections", len(c.tr.idle))
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
	if len(c.tr.idle) != 0 {
		t.Errorf("a cancelled stream left %d kept connections", len(c.tr.idle))
	}
	if _, err := c.Exec(context.Background(), "quick", api.ExecRequest{Cmd: []string{"x"}}, ExecIO{}); err != nil {
		t.Fatalf("exec after a cancel: %v", err)
	}
}

// JSON answers keep their connection too (read to their end), and
// uploads too large or of unknown size for the calling goroutine to write
// before reading go through net/http's transport, which writes them while
// the answer is read.
func TestTransportJSONAndUploads(t *testing.T) {
	d := startStreamDaemon(t)
	c := d.client(t)
	ctx := context.Background()
	for i := range 5 {
		v, err := c.Version(ctx)
		if err != nil || len(v.Version) != 10000 {
			t.Fatalf("version %d: %v", i, err)
		}
	}
	if n := d.conns.Load(); n != 1 {
		t.Errorf("5 JSON calls in turn used %d connections, want 1", n)
	}
	pr, pw := io.Pipe()
	go func() {
		pw.Write(bytes.Repeat([]byte("x"), 3<<20))
		pw.Close()
	}()
	for _, up := range []struct {
		body io.Reader
		want string
	}{{bytes.NewReader(make([]byte, 2<<20)), "2097152"}, {pr, "3145728"}, {strings.NewReader("small"), "5"}} {
		req, _ := http.NewRequest(http.MethodPost, c.base+"/upload", up.body)
		resp, err := c.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != up.want {
			t.Errorf("upload of %T: server read %s bytes, want %s", up.body, got, up.want)
		}
	}
}

// A daemon that refuses a body before reading it all answers, and closes:
// the answer is the result, not the broken write.
func TestTransportEarlyAnswer(t *testing.T) {
	d := startStreamDaemon(t)
	c := d.client(t)
	for _, size := range []int{900 << 10, 4 << 20} {
		req, _ := http.NewRequest(http.MethodPost, c.base+"/reject", bytes.NewReader(make([]byte, size)))
		resp, err := c.http.Do(req)
		if err != nil {
			t.Fatalf("%d bytes: %v", size, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("%d bytes: status %d", size, resp.StatusCode)
		}
	}
}
