package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/client"
)

// TestUnauthenticatedFlood: thousands of connections that hold no token
// (half sent one request and got their 401, half sent nothing) do not
// take the daemon's file descriptors, and while they are held an
// authenticated client over TCP and a client of the unix socket are
// answered at once; the flood's connections are closed (after the 401 at
// once, the silent ones at the read timeout). Before the fix each
// connection stayed open for as long as the peer kept it.
func TestUnauthenticatedFlood(t *testing.T) {
	d, token, addr := newTCPDaemonArgs(t, "--http-read-timeout", "2s", "--http-idle-timeout", "3s")
	base := openFDs(t, d)

	const flood = 3000
	conns := make([]net.Conn, 0, flood)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < flood; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dialing flood connection %d: %v", i, err)
		}
		if i%2 == 0 {
			fmt.Fprintf(c, "GET /v1/version HTTP/1.1\r\nHost: x\r\n\r\n")
		}
		conns = append(conns, c)
	}
	if n := openFDs(t, d); n > base+200 {
		t.Errorf("the daemon holds %d descriptors with %d unauthenticated connections open (%d before)", n, flood, base)
	}

	tc, err := client.New("tcp://"+addr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*client.Client{"tcp with token": tc, "unix socket": d.Client()} {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Version(ctx)
		cancel()
		if err != nil || time.Since(start) > 2*time.Second {
			t.Errorf("%s during the flood: %v after %v", name, err, time.Since(start))
		}
	}

	// Every flood connection ends: read until an error that is not our
	// own deadline.
	deadline := time.Now().Add(15 * time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := 0
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(deadline)
			buf := make([]byte, 4096)
			for {
				_, err := c.Read(buf)
				if err == nil {
					continue
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					mu.Lock()
					open++
					mu.Unlock()
				}
				return
			}
		}()
	}
	wg.Wait()
	if open > 0 {
		t.Errorf("%d of %d unauthenticated connections still open after 15 s", open, flood)
	}
}

// TestStreamOutlivesTimeouts: an authenticated exec over TCP whose output
// streams for longer than the read and idle timeouts (and is silent for
// longer than them) runs to its end.
func TestStreamOutlivesTimeouts(t *testing.T) {
	t.Parallel()
	d, token, addr := newTCPDaemonArgs(t, "--http-read-timeout", "1s", "--http-idle-timeout", "1s")
	id := d.Create(api.CreateRequest{})
	tc, err := client.New("tcp://"+addr, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	st, err := tc.Exec(ctx, id, api.ExecRequest{Cmd: []string{"sh", "-c", "echo a; sleep 3; echo b; sleep 2; echo c"}}, client.ExecIO{Stdout: &out})
	if err != nil || st.ExitCode != 0 || out.String() != "a\nb\nc\n" {
		t.Fatalf("exec across the timeouts: %v, %+v, %q", err, st, out.String())
	}
}

// newTCPDaemonArgs is newTCPDaemon with more daemon flags.
func newTCPDaemonArgs(t *testing.T, extra ...string) (*Daemon, string, string) {
	t.Helper()
	token := "test-token-" + randHex(8)
	tokenFile := t.TempDir() + "/token"
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeHostPort(t)
	return newDaemon(t, append([]string{"--listen", "tcp://" + addr, "--token-file", tokenFile}, extra...)...), token, addr
}

// openFDs counts the daemon's open file descriptors.
func openFDs(t *testing.T, d *Daemon) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestSelfEndpointFlood: the sandboxes' self endpoint listens on every
// address of the host, so any peer can reach it: a peer that is no
// sandbox gets its 403 and the connection closed, and its thousand
// silent connections do not take the daemon's descriptors. Before, each
// stayed open as long as the peer kept it.
func TestSelfEndpointFlood(t *testing.T) {
	d := newDaemon(t)
	m := regexp.MustCompile(`self_port=(\d+)`).FindStringSubmatch(d.Log())
	if m == nil {
		t.Fatalf("no self_port in the daemon's log:\n%s", d.Log())
	}
	addr := "127.0.0.1:" + m[1]
	base := openFDs(t, d)
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < 1000; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dialing connection %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	if n := openFDs(t, d); n > base+200 {
		t.Errorf("the daemon holds %d descriptors with 1000 connections to the self endpoint open (%d before)", n, base)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /v1/self HTTP/1.1\r\nHost: paddock.internal\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if !strings.HasPrefix(string(b), "HTTP/1.1 403") || err != nil {
		t.Errorf("a host peer's request: %q, %v (want a 403, then the connection closed)", b, err)
	}
}
