package connlimit

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"
)

// serve starts an HTTP server on a Listener with lim whose handler
// (under Handler) authenticates requests carrying "X-Key: ok" and answers
// others 401.
func serve(t *testing.T, lim Limits) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(ln, lim, nil)
	hs := &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		ConnState:         l.ConnState,
		ConnContext:       ConnContext,
		Handler: Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Key") != "ok" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			Authenticated(w, r)
			io.WriteString(w, "hello")
		})),
	}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	return l
}

// dialFrom connects to l from a loopback address of its own.
func dialFrom(t *testing.T, l *Listener, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closed reports whether the peer closed c within a second.
func closed(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := io.Copy(io.Discard, c)
	if err == nil {
		return true
	}
	ne, ok := err.(net.Error)
	return !ok || !ne.Timeout()
}

func waitCounts(t *testing.T, l *Listener, total, unauth int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tot, un := l.Counts()
		if tot == total && un == unauth {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("counts %d total, %d unauthenticated; want %d, %d", tot, un, total, unauth)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPerPeer: a peer's silent connections beyond its share push out its
// own oldest, not another peer's.
func TestPerPeer(t *testing.T) {
	l := serve(t, Limits{PerPeer: 2})
	other := dialFrom(t, l, "127.0.0.3")
	var mine []net.Conn
	for i := 0; i < 5; i++ {
		mine = append(mine, dialFrom(t, l, "127.0.0.2"))
		waitCounts(t, l, 1+min(i+1, 2), 1+min(i+1, 2))
	}
	for i, c := range mine {
		if got, want := closed(c), i < 3; got != want {
			t.Errorf("connection %d of the flooding peer closed: %v, want %v", i, got, want)
		}
	}
	if closed(other) {
		t.Error("the other peer's connection was closed")
	}
}

// TestListenerShare: beyond the listener's unauthenticated share the
// oldest unauthenticated connection goes, whoever's; an authenticated one
// stays, and is kept open between requests, while an unauthenticated one
// is closed after its 401.
func TestListenerShare(t *testing.T) {
	l := serve(t, Limits{Unauthenticated: 2})
	authed := dialFrom(t, l, "127.0.0.4")
	br := bufio.NewReader(authed)
	ask := func() {
		t.Helper()
		io.WriteString(authed, "GET / HTTP/1.1\r\nHost: x\r\nX-Key: ok\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("authenticated request: %v %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
	}
	ask()
	waitCounts(t, l, 1, 0)
	a := dialFrom(t, l, "127.0.0.5")
	b := dialFrom(t, l, "127.0.0.6")
	waitCounts(t, l, 3, 2)
	c := dialFrom(t, l, "127.0.0.7")
	waitCounts(t, l, 3, 2)
	if !closed(a) || closed(b) {
		t.Error("the oldest unauthenticated connection was not the one closed")
	}
	ask()

	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	cr := bufio.NewReader(c)
	resp, err := http.ReadResponse(cr, nil)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unauthenticated request: %v %v", resp, err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := cr.ReadByte(); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("the connection stayed open after its 401: %v", err)
	}
}

// TestTotal: a listener full of authenticated connections refuses a new
// one rather than drop one of them.
func TestTotal(t *testing.T) {
	l := serve(t, Limits{Conns: 1})
	c := dialFrom(t, l, "127.0.0.8")
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nX-Key: ok\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("authenticated request: %v %v", resp, err)
	}
	waitCounts(t, l, 1, 0)
	if !closed(dialFrom(t, l, "127.0.0.9")) {
		t.Error("a connection beyond the total was kept")
	}
	if closed(c) {
		t.Error("the authenticated connection was dropped for a new one")
	}
}

// TestUnauthenticatedSaysClose: a response on a connection that has not
// authenticated says "Connection: close" (the listener closes it after
// the response), so a client opens a new connection for its next
// request; an authenticated one keeps its connection for the next.
func TestUnauthenticatedSaysClose(t *testing.T) {
	l := serve(t, Limits{})
	c := &http.Client{Timeout: 5 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	get := func(key string) (connection string, reused bool) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+l.Addr().String()+"/", nil)
		if key != "" {
			req.Header.Set("X-Key", key)
		}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		}))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Close {
			connection = "close"
		}
		return connection, reused
	}
	if conn, _ := get(""); conn != "close" {
		t.Error("a 401 on an unauthenticated connection did not say Connection: close")
	}
	for i := range 3 {
		conn, reused := get("ok")
		if conn == "close" {
			t.Errorf("request %d, authenticated, said Connection: close", i)
		}
		if i > 0 && !reused {
			t.Errorf("request %d did not reuse the authenticated connection", i)
		}
	}
	waitCounts(t, l, 1, 0)
}
