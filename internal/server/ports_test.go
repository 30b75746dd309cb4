package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/errdefs"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestParsePort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"1", 1}, {"3000", 3000}, {"65535", 65535},
		{"0", 0}, {"65536", 0}, {"70000", 0}, {"abc", 0}, {"", 0},
		{"03000", 0}, {"+80", 0}, {"-1", 0}, {"1e3", 0}, {"123456", 0}, {" 80", 0},
	} {
		got, err := parsePort(tc.in)
		if tc.want == 0 {
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "port") {
				t.Errorf("parsePort(%q) = %d, %v; want an invalid port error", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("parsePort(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestSplitPortPath(t *testing.T) {
	for _, tc := range []struct {
		in, prefix, rest string
		ok               bool
	}{
		{"/v1/sandboxes/abc/ports/3000/", "/v1/sandboxes/abc/ports/3000", "/", true},
		{"/v1/sandboxes/abc/ports/3000/a/b%2Fc", "/v1/sandboxes/abc/ports/3000", "/a/b%2Fc", true},
		{"/v1/sandboxes/abc/ports/3000//x/../y", "/v1/sandboxes/abc/ports/3000", "//x/../y", true},
		{"/v1/sandboxes/%2e%2e/ports/3000/x", "/v1/sandboxes/%2e%2e/ports/3000", "/x", true},
		{"/v1/sandboxes/abc/ports/3000", "", "", false},
		{"/v1/sandboxes/abc/ports", "", "", false},
		{"/v1/sandboxes/abc/ports/", "", "", false},
		{"/v1/sandboxes//ports/3000/", "", "", false},
		{"/v1/sandboxes/abc/exec", "", "", false},
		{"/v1/sandboxes/abc/files/ports/3000/", "", "", false},
		{"/v2/sandboxes/abc/ports/3000/", "", "", false},
	} {
		prefix, rest, ok := splitPortPath(tc.in)
		if prefix != tc.prefix || rest != tc.rest || ok != tc.ok {
			t.Errorf("splitPortPath(%q) = %q, %q, %v; want %q, %q, %v", tc.in, prefix, rest, ok, tc.prefix, tc.rest, tc.ok)
		}
	}
}

func TestRewriteLocation(t *testing.T) {
	const prefix = "/v1/sandboxes/abc/ports/3000"
	for _, tc := range []struct{ in, want string }{
		{"/login", prefix + "/login"},
		{"/dir/?a=1#top", prefix + "/dir/?a=1#top"},
		{prefix + "/already", prefix + "/already"},
		{"http://localhost:3000/x?y=1", prefix + "/x?y=1"},
		{"http://127.0.0.1:3000", prefix + "/"},
		{"http://[::1]:3000/a%2Fb", prefix + "/a%2Fb"},
		{"http://localhost:4000/x", "http://localhost:4000/x"},
		{"http://localhost/x", "http://localhost/x"},
		{"https://example.com/x", "https://example.com/x"},
		{"//example.com/x", "//example.com/x"},
		{"relative/path", "relative/path"},
	} {
		if got := rewriteLocation(tc.in, prefix, "3000"); got != tc.want {
			t.Errorf("rewriteLocation(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestUpstreamHost(t *testing.T) {
	id, port, err := parseUpstream(upstreamHost("abc-123", 8080))
	if err != nil || id != "abc-123" || port != 8080 {
		t.Fatalf("round trip = %q, %d, %v", id, port, err)
	}
	for _, bad := range []string{"localhost:3000", "127.0.0.1:3000", "abc.sandbox.paddock.invalid:0", "x"} {
		if _, _, err := parseUpstream(bad); err == nil {
			t.Errorf("parseUpstream(%q) accepted", bad)
		}
	}
}

// fakeSandboxes stands in for the manager and the guests: sandbox "box"
// runs, and its ports map to loopback listeners of the test.
type fakeSandboxes struct {
	mu    sync.Mutex
	ports map[int]string // sandbox port -> host address
	done  chan struct{}
	dials int
}

func newFakeSandboxes() *fakeSandboxes {
	return &fakeSandboxes{ports: map[int]string{}, done: make(chan struct{})}
}

func (f *fakeSandboxes) dial(ctx context.Context, id string, port int) (net.Conn, error) {
	if id != "box" {
		return nil, errdefs.NotFound("sandbox", id)
	}
	f.mu.Lock()
	f.dials++
	addr, ok := f.ports[port]
	f.mu.Unlock()
	if !ok {
		return nil, &portDialError{ID: id, Port: port, Err: fmt.Errorf("%w: nothing listens on port %d in the sandbox", errdefs.ErrNotFound, port)}
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (f *fakeSandboxes) doneOf(_ context.Context, id string) (<-chan struct{}, error) {
	if id != "box" {
		return nil, errdefs.NotFound("sandbox", id)
	}
	return f.done, nil
}

// echoListener echoes each connection until EOF, then closes it.
func echoListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().String()
}

// echoOnce sends msg through addr, half-closes, and returns what came back.
func echoOnce(addr, msg string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}

// refused reports whether addr refuses connections within a few seconds
// (a forward closes asynchronously when its sandbox ends).
func refused(addr string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func TestPortTable(t *testing.T) {
	sb := newFakeSandboxes()
	sb.ports[3000] = echoListener(t)
	pt := newPortTable(sb.dial, sb.doneOf, quietLog)
	t.Cleanup(pt.closeAll)

	f, created, err := pt.open(context.Background(), "box", 3000)
	if err != nil || !created {
		t.Fatalf("open = %+v, %v, %v", f, created, err)
	}
	if host, _, _ := net.SplitHostPort(f.HostAddress); host != "127.0.0.1" {
		t.Fatalf("forward listens on %s, want 127.0.0.1 only", f.HostAddress)
	}
	again, created, err := pt.open(context.Background(), "box", 3000)
	if err != nil || created || again.HostAddress != f.HostAddress {
		t.Fatalf("second open = %+v, %v, %v; want the same forward", again, created, err)
	}
	if got, err := echoOnce(f.HostAddress, "hello"); err != nil || got != "hello" {
		t.Fatalf("echo through the forward = %q, %v", got, err)
	}

	// Nothing listens on 4000: the forward opens, and its connections are
	// reset.
	f4, _, err := pt.open(context.Background(), "box", 4000)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := echoOnce(f4.HostAddress, "x"); err == nil && got != "" {
		t.Fatalf("forward to a closed port answered %q", got)
	}

	if l := pt.list("box"); len(l) != 2 || l[0].Port != 3000 || l[1].Port != 4000 {
		t.Fatalf("list = %+v", l)
	}
	if l := pt.list("other"); len(l) != 0 {
		t.Fatalf("list of another sandbox = %+v", l)
	}

	for _, tc := range []struct {
		id   string
		port int
		want error
	}{
		{"nosuch", 3000, errdefs.ErrNotFound},
		{"box", 0, errdefs.ErrInvalid},
		{"box", 65536, errdefs.ErrInvalid},
	} {
		if _, _, err := pt.open(context.Background(), tc.id, tc.port); !errors.Is(err, tc.want) {
			t.Errorf("open(%q, %d) = %v, want %v", tc.id, tc.port, err, tc.want)
		}
	}

	if err := pt.close("box", 4000); err != nil {
		t.Fatal(err)
	}
	if err := pt.close("box", 4000); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second close = %v, want not found", err)
	}
	if !refused(f4.HostAddress) {
		t.Fatalf("closed forward %s still accepts", f4.HostAddress)
	}

	// A connection held open is closed when the sandbox ends, and the
	// forward is gone.
	held, err := net.Dial("tcp", f.HostAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	waitConns(t, pt, 3000, 1)
	close(sb.done)
	if !refused(f.HostAddress) {
		t.Fatalf("forward %s still accepts after the sandbox ended", f.HostAddress)
	}
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("held connection still open after the sandbox ended: %v", err)
	}
	if l := pt.list("box"); len(l) != 0 {
		t.Fatalf("list after the sandbox ended = %+v", l)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// waitConns waits until the forward of port carries n connections.
func waitConns(t *testing.T, pt *portTable, port, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, f := range pt.list("box") {
			if f.Port == port && f.Connections == n {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("forward of %d never carried %d connections: %+v", port, n, pt.list("box"))
}

// TestPortTableLimit: a forward carries at most maxConns connections; one
// more is reset, and a slot freed is usable again.
func TestPortTableLimit(t *testing.T) {
	sb := newFakeSandboxes()
	sb.ports[3000] = echoListener(t)
	pt := newPortTable(sb.dial, sb.doneOf, quietLog)
	pt.maxConns = 3
	t.Cleanup(pt.closeAll)
	f, _, err := pt.open(context.Background(), "box", 3000)
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", f.HostAddress)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	waitConns(t, pt, 3000, 3)
	if got, err := echoOnce(f.HostAddress, "over"); err == nil && got == "over" {
		t.Fatal("a connection over the limit was carried")
	}
	held[0].Close()
	waitConns(t, pt, 3000, 2)
	if got, err := echoOnce(f.HostAddress, "again"); err != nil || got != "again" {
		t.Fatalf("after a slot freed: %q, %v", got, err)
	}
}

// appServer is the app in the "sandbox" for proxy tests: it echoes the
// request as JSON, redirects on /redirect, and on Upgrade: echo switches
// to echoing raw bytes.
func appServer(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/redirect":
			http.Redirect(w, r, "/target?x=1", http.StatusFound)
		case r.Header.Get("Upgrade") == "echo":
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			brw.Flush()
			io.Copy(c, brw)
		default:
			body, _ := io.ReadAll(r.Body)
			json.NewEncoder(w).Encode(map[string]any{
				"method": r.Method, "path": r.URL.Path, "raw_path": r.URL.EscapedPath(), "query": r.URL.RawQuery,
				"host": r.Host, "headers": r.Header, "body": string(body),
			})
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func proxyServer(t *testing.T, sb *fakeSandboxes) string {
	t.Helper()
	proxy := newPortProxy(sb.dial, quietLog)
	mux := http.NewServeMux()
	for _, m := range proxiedMethods {
		mux.Handle(m+" /v1/sandboxes/{id}/ports/{port}/{path...}", proxy)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(proxy.Transport.(*http.Transport).CloseIdleConnections)
	return srv.URL
}

func TestPortProxy(t *testing.T) {
	sb := newFakeSandboxes()
	sb.ports[3000] = appServer(t)
	base := proxyServer(t, sb)

	req, _ := http.NewRequest("POST", base+"/v1/sandboxes/box/ports/3000/a/b%2Fc?q=1&r=%20x", strings.NewReader("payload"))
	req.Header.Set("Authorization", "Bearer daemon-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Method, Path, Query, Host, Body string
		RawPath                         string `json:"raw_path"`
		Headers                         http.Header
	}
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if resp.StatusCode != 200 || got.Method != "POST" || got.Path != "/a/b/c" || got.Query != "q=1&r=%20x" || got.Body != "payload" {
		t.Fatalf("app saw %d %+v", resp.StatusCode, got)
	}
	// The handler's decoded path loses the %2F; the raw one keeps it.
	if got.RawPath != "/a/b%2Fc" {
		t.Errorf("app's raw path = %q, want /a/b%%2Fc", got.RawPath)
	}
	if got.Host != "localhost:3000" {
		t.Errorf("app's Host = %q, want localhost:3000", got.Host)
	}
	if a := got.Headers.Get("Authorization"); a != "" {
		t.Errorf("the daemon's Authorization header reached the app: %q", a)
	}
	if p := got.Headers.Get("X-Forwarded-Prefix"); p != "/v1/sandboxes/box/ports/3000" {
		t.Errorf("X-Forwarded-Prefix = %q", p)
	}
	if h := got.Headers.Get("X-Forwarded-Host"); h == "" || got.Headers.Get("X-Forwarded-Proto") != "http" {
		t.Errorf("X-Forwarded-Host %q, X-Forwarded-Proto %q", h, got.Headers.Get("X-Forwarded-Proto"))
	}

	// Redirects stay under the prefix.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err = noFollow.Get(base + "/v1/sandboxes/box/ports/3000/redirect")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != 302 || loc != "/v1/sandboxes/box/ports/3000/target?x=1" {
		t.Errorf("redirect = %d %q", resp.StatusCode, loc)
	}

	// Nothing listens on 3001: a JSON 502 naming the port.
	resp, err = http.Get(base + "/v1/sandboxes/box/ports/3001/")
	if err != nil {
		t.Fatal(err)
	}
	var e api.Error
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 502 || e.Code != "unavailable" || !strings.Contains(e.Message, "nothing listens on port 3001") {
		t.Errorf("closed port: %d %+v", resp.StatusCode, e)
	}

	// A sandbox that is gone: the manager's 404.
	resp, err = http.Get(base + "/v1/sandboxes/gone/ports/3000/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("gone sandbox: %d", resp.StatusCode)
	}
}

// TestPortProxyUpgrade: a 101 from the app turns the proxied connection
// into a byte pipe both ways (how WebSockets pass).
func TestPortProxyUpgrade(t *testing.T) {
	sb := newFakeSandboxes()
	sb.ports[3000] = appServer(t)
	base := proxyServer(t, sb)
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /v1/sandboxes/box/ports/3000/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade answer: %v %v", resp, err)
	}
	for i := range 3 {
		msg := "round " + strconv.Itoa(i) + "\n"
		c.Write([]byte(msg))
		line, err := br.ReadString('\n')
		if err != nil || line != msg {
			t.Fatalf("echo %d = %q, %v", i, line, err)
		}
	}
}

// TestPortProxyPoolsPerSandbox: the transport keeps idle connections; one
// to a sandbox's port must never serve another sandbox's request.
func TestPortProxyPoolsPerSandbox(t *testing.T) {
	var mu sync.Mutex
	dialed := map[string]int{}
	apps := map[string]string{"one": appServerNamed(t, "one"), "two": appServerNamed(t, "two")}
	proxy := newPortProxy(func(ctx context.Context, id string, port int) (net.Conn, error) {
		mu.Lock()
		dialed[id]++
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, "tcp", apps[id])
	}, quietLog)
	mux := http.NewServeMux()
	mux.Handle("GET /v1/sandboxes/{id}/ports/{port}/{path...}", proxy)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer proxy.Transport.(*http.Transport).CloseIdleConnections()
	for i := range 6 {
		id := []string{"one", "two"}[i%2]
		resp, err := http.Get(srv.URL + "/v1/sandboxes/" + id + "/ports/3000/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != id {
			t.Fatalf("request %d for sandbox %s answered by %q", i, id, b)
		}
	}
	if dialed["one"] != 1 || dialed["two"] != 1 {
		t.Logf("dials per sandbox: %v (keep-alive reuse expected)", dialed)
	}
}

func appServerNamed(t *testing.T, name string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// TestPortTableTotalLimit: all forwards together carry at most maxTotal
// connections.
func TestPortTableTotalLimit(t *testing.T) {
	sb := newFakeSandboxes()
	sb.ports[3000] = echoListener(t)
	sb.ports[3001] = echoListener(t)
	pt := newPortTable(sb.dial, sb.doneOf, quietLog)
	pt.maxTotal = 2
	t.Cleanup(pt.closeAll)
	f0, _, err := pt.open(context.Background(), "box", 3000)
	if err != nil {
		t.Fatal(err)
	}
	f1, _, err := pt.open(context.Background(), "box", 3001)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{f0.HostAddress, f1.HostAddress} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	waitConns(t, pt, 3000, 1)
	waitConns(t, pt, 3001, 1)
	if got, err := echoOnce(f1.HostAddress, "over"); err == nil && got == "over" {
		t.Fatal("a connection over the daemon's limit was carried")
	}
	pt.close("box", 3000)
	if !waitForCount(pt, 1) {
		t.Fatalf("closing a forward did not release its connections: %d", pt.connCount.Load())
	}
	if got, err := echoOnce(f1.HostAddress, "again"); err != nil || got != "again" {
		t.Fatalf("after a forward closed: %q, %v", got, err)
	}
}

func waitForCount(pt *portTable, n int64) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if pt.connCount.Load() == n {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}
