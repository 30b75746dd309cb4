package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

// echoPath answers with its path, and counts the requests it saw.
type echoPath struct{ hits atomic.Int64 }

func (e *echoPath) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.hits.Add(1)
	io.Copy(io.Discard, r.Body)
	io.WriteString(w, "path="+r.URL.Path)
}

func get(t *testing.T, c *http.Client, url string) (int, string, *http.Response) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading: %v", url, err)
	}
	return resp.StatusCode, string(b), resp
}

func TestSpliceIsNotIntercepted(t *testing.T) {
	h := newHarness(t)
	srv := startTLS(t, nil, &echoPath{}, "open.example.com")
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "open.example.com")})
	c := h.client("sb1", sb1Addr, serverAddr(t, srv))
	code, body, resp := get(t, c, "https://open.example.com/x")
	if code != 200 || body != "path=/x" {
		t.Fatalf("%d %q", code, body)
	}
	if iss := resp.TLS.PeerCertificates[0].Issuer.CommonName; iss != testServerCA.Certificate().Subject.CommonName {
		t.Fatalf("the client saw a certificate from %q, not the upstream's own", iss)
	}
	c.CloseIdleConnections()
	ev := h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindTLS })
	if ev.Action != "allow" || ev.Intercepted || ev.Host != "open.example.com" || ev.Rule != "open.example.com" ||
		ev.IP != publicAddr.String() || ev.Port != serverAddr(t, srv).Port() || ev.BytesOut < 100 || ev.BytesIn < 500 {
		t.Fatalf("event %+v", ev)
	}
}

func TestInterceptPathRules(t *testing.T) {
	h := newHarness(t)
	echo := &echoPath{}
	srv := startTLS(t, nil, echo, "api.example.com")
	port := itoa(serverAddr(t, srv).Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "https://api.example.com:"+port+"/v1/")})
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			c := h.client("sb1", sb1Addr, serverAddr(t, srv))
			c.Transport.(*http.Transport).ForceAttemptHTTP2 = h2
			code, body, resp := get(t, c, "https://api.example.com:"+port+"/v1/allowed")
			if code != 200 || body != "path=/v1/allowed" {
				t.Fatalf("%d %q", code, body)
			}
			if resp.TLS.PeerCertificates[0].Issuer.CommonName != "paddock sandbox sb1 CA" {
				t.Fatalf("issuer %q", resp.TLS.PeerCertificates[0].Issuer.CommonName)
			}
			if want := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]; resp.Proto != want {
				t.Errorf("proto %s, want %s", resp.Proto, want)
			}
			before := echo.hits.Load()
			code, body, resp = get(t, c, "https://api.example.com:"+port+"/v2/denied")
			if code != 403 || resp.Header.Get("X-Paddock-Egress") != "denied" {
				t.Fatalf("%d %q", code, body)
			}
			var db deniedBody
			if err := json.Unmarshal([]byte(body), &db); err != nil {
				t.Fatal(err)
			}
			want := "--allow https://api.example.com:" + port + "/v2/denied"
			if db.Suggest != want || !strings.Contains(db.Message, want) || !strings.Contains(db.Reason, "GET https://api.example.com:"+port+"/v2/denied") {
				t.Fatalf("403 body %+v", db)
			}
			if echo.hits.Load() != before {
				t.Fatal("a denied request reached the upstream")
			}
			// The same connection goes on: the next request is decided again.
			if code, _, _ := get(t, c, "https://api.example.com:"+port+"/v1/again"); code != 200 {
				t.Fatalf("after a denial: %d", code)
			}
		})
	}
	ev := h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindHTTP && e.Action == "deny" })
	if ev.Path != "/v2/denied" || ev.Method != "GET" || ev.Status != 403 || !ev.Intercepted || ev.Suggest == "" {
		t.Fatalf("event %+v", ev)
	}
}

func TestUpstreamCertificateVerified(t *testing.T) {
	h := newHarness(t)
	rogue, err := NewCA("rogue")
	if err != nil {
		t.Fatal(err)
	}
	echo := &echoPath{}
	srv := startTLS(t, rogue, echo, "api.example.com")
	port := itoa(serverAddr(t, srv).Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "https://api.example.com:"+port+"/")})
	code, body, _ := get(t, h.client("sb1", sb1Addr, serverAddr(t, srv)), "https://api.example.com:"+port+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "certificate") {
		t.Fatalf("%d %q", code, body)
	}
	ev := h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindHTTP })
	if !strings.Contains(ev.Error, "upstream certificate not trusted") || ev.Status != 502 {
		t.Fatalf("event %+v", ev)
	}
	// A name the certificate does not cover is refused too.
	srv2 := startTLS(t, nil, echo, "other.example.com")
	port2 := itoa(serverAddr(t, srv2).Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "https://api.example.com:"+port2+"/")})
	if code, _, _ := get(t, h.client("sb1", sb1Addr, serverAddr(t, srv2)), "https://api.example.com:"+port2+"/x"); code != 502 {
		t.Fatalf("wrong-name upstream: %d", code)
	}
	if echo.hits.Load() != 0 {
		t.Fatal("a request reached an unverified upstream")
	}
}

func TestPlainHTTPPerRequest(t *testing.T) {
	h := newHarness(t)
	echo := &echoPath{}
	srv := startHTTP(t, echo)
	dst := serverAddr(t, srv)
	port := itoa(dst.Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "http://web.example.com:"+port+"/ok/", "plain.example.com")})
	conn, err := h.dial(context.Background(), sb1Addr, dst)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	send := func(host, path string) (int, string) {
		fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s%s: %v", host, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// One keep-alive connection, decided request by request.
	for _, tc := range []struct {
		host, path string
		code       int
	}{
		{"web.example.com", "/ok/1", 200},
		{"web.example.com", "/no", 403},
		{"plain.example.com", "/anything", 200},
		{"evil.example.com", "/ok/1", 403},
		{"web.example.com:" + port, "/ok/2", 200},
	} {
		if code, body := send(tc.host, tc.path); code != tc.code {
			t.Fatalf("%s%s: %d %s", tc.host, tc.path, code, body)
		}
	}
	if echo.hits.Load() != 3 {
		t.Fatalf("upstream saw %d requests", echo.hits.Load())
	}
}

// startTCP runs a raw TCP server: greeting (if any) first, then echo.
func startTCP(t *testing.T, greeting string) netip.AddrPort {
	t.Helper()
	ln := listenPublic(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.WriteString(c, greeting)
				io.Copy(c, c)
			}()
		}
	}()
	return addrPort(ln.Addr())
}

// expectReset checks that the proxy refused conn at once: a reset or
// an immediate close, never a connection that hangs.
func expectRefused(t *testing.T, conn net.Conn, write string) {
	t.Helper()
	start := time.Now()
	if write != "" {
		conn.Write([]byte(write))
	}
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, 256)
	n, err := conn.Read(b)
	if err == nil {
		if tlsAlert := n >= 7 && b[0] == 21; !tlsAlert {
			t.Fatalf("read %q from a refused connection", b[:n])
		}
		_, err = conn.Read(b)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the refused connection was left hanging")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("refusal took %v", d)
	}
}

func TestRawTCP(t *testing.T) {
	h := newHarness(t)
	echoDst := startTCP(t, "")
	bannerDst := startTCP(t, "220 hello\r\n")
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, publicAddr.String()+":"+itoa(echoDst.Port()), publicAddr.String()+":"+itoa(bannerDst.Port()))})

	conn, err := h.dial(context.Background(), sb1Addr, echoDst)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "ping\n")
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo: %q %v", line, err)
	}
	conn.Close()
	ev := h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindTCP })
	if ev.Action != "allow" || ev.BytesOut != 5 || ev.BytesIn != 5 || ev.IP != publicAddr.String() {
		t.Fatalf("event %+v", ev)
	}

	// A server that speaks first: the proxy decides by address after the peek timeout.
	conn, err = h.dial(context.Background(), sb1Addr, bannerDst)
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(3 * time.Second))
	line, err = bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "220 hello\r\n" {
		t.Fatalf("banner: %q %v", line, err)
	}
	conn.Close()

	// Denied: another port of the same host, refused before a byte is read.
	other := netip.AddrPortFrom(publicAddr, 1)
	conn, err = h.dial(context.Background(), sb1Addr, other)
	if err == nil {
		expectRefused(t, conn, "")
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	ev = h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindTCP && e.Action == "deny" })
	if ev.Suggest != "--allow 127.0.0.10:1" {
		t.Fatalf("event %+v", ev)
	}
}

func TestExplicitProxy(t *testing.T) {
	h := newHarness(t)
	echo := &echoPath{}
	tlsSrv := startTLS(t, nil, echo, "open.example.com", "api.example.com")
	httpSrv := startHTTP(t, echo)
	tp, hp := itoa(serverAddr(t, tlsSrv).Port()), itoa(serverAddr(t, httpSrv).Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "open.example.com", "https://api.example.com:"+tp+"/v1/", "http://web.example.com:"+hp+"/")})
	c := h.proxyClient("sb1", sb1Addr)
	code, _, resp := get(t, c, "https://open.example.com:"+tp+"/x")
	if code != 200 || resp.TLS.PeerCertificates[0].Issuer.CommonName != testServerCA.Certificate().Subject.CommonName {
		t.Fatalf("CONNECT spliced: %d", code)
	}
	code, _, resp = get(t, c, "https://api.example.com:"+tp+"/v1/x")
	if code != 200 || resp.TLS.PeerCertificates[0].Issuer.CommonName != "paddock sandbox sb1 CA" {
		t.Fatalf("CONNECT intercepted: %d", code)
	}
	if code, _, _ := get(t, c, "https://api.example.com:"+tp+"/v2/x"); code != 403 {
		t.Fatalf("CONNECT intercepted, denied path: %d", code)
	}
	if _, err := c.Get("https://denied.example.com:" + tp + "/"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("CONNECT to a denied host: %v", err)
	}
	if code, body, _ := get(t, c, "http://web.example.com:"+hp+"/y"); code != 200 || body != "path=/y" {
		t.Fatalf("absolute-form: %d %q", code, body)
	}
	code, body, _ := get(t, c, "http://nope.example.com:"+hp+"/y")
	if code != 403 || !strings.Contains(body, "--allow nope.example.com") {
		t.Fatalf("absolute-form denied: %d %q", code, body)
	}
	ev := h.waitEvent("sb1", func(e Event) bool { return e.Method == "CONNECT" })
	if ev.Action != "deny" || ev.Host != "denied.example.com" || ev.Status != 403 {
		t.Fatalf("event %+v", ev)
	}
}

func TestPolicySwapAppliesToNewConnections(t *testing.T) {
	h := newHarness(t)
	srv := startTLS(t, nil, &echoPath{}, "open.example.com")
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "open.example.com")})
	c := h.client("sb1", sb1Addr, serverAddr(t, srv))
	if code, _, _ := get(t, c, "https://open.example.com/"); code != 200 {
		t.Fatal(code)
	}
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "other.example.com")})
	c2 := h.client("sb1", sb1Addr, serverAddr(t, srv))
	if _, err := c2.Get("https://open.example.com/"); err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("new connection after the swap: %v", err)
	}
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "open.example.com")})
	if code, _, _ := get(t, h.client("sb1", sb1Addr, serverAddr(t, srv)), "https://open.example.com/"); code != 200 {
		t.Fatal(code)
	}
	// The other sandbox never had a policy.
	if _, err := h.client("sb2", sb2Addr, serverAddr(t, srv)).Get("https://open.example.com/"); err == nil {
		t.Fatal("sb2 was let through")
	}
}

func TestUnknownPeerRefused(t *testing.T) {
	h := newHarness(t)
	conn, err := h.dial(context.Background(), netip.MustParseAddr("127.0.0.99"), netip.AddrPortFrom(publicAddr, 80))
	if err == nil {
		_, err = conn.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read: %v", err)
	}
}

func TestEventJSON(t *testing.T) {
	ev := Event{Time: time.Date(2025, 1, 2, 15, 4, 5, 0, time.UTC), Kind: KindHTTP, Action: "deny", Host: "api.example.com",
		IP: "203.0.113.7", Port: 443, Method: "GET", Path: "/v2", Status: 403, Reason: "r", Suggest: "--allow x",
		Intercepted: true, Secrets: []string{"T"}, Exfiltration: true, DurationMS: 0.5}
	b, _ := json.Marshal(ev)
	want := `{"time":"2025-01-02T15:04:05Z","kind":"http","action":"deny","host":"api.example.com","ip":"203.0.113.7","port":443,` +
		`"method":"GET","path":"/v2","status":403,"reason":"r","suggest":"--allow x","intercepted":true,"bytes_out":0,"bytes_in":0,` +
		`"secrets":["T"],"exfiltration":true,"duration_ms":0.5}`
	if string(b) != want {
		t.Fatalf("\n got %s\nwant %s", b, want)
	}
}

func TestEventsCountBytes(t *testing.T) {
	h := newHarness(t)
	srv := startTLS(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write(make([]byte, 5000))
	}), "api.example.com")
	port := itoa(serverAddr(t, srv).Port())
	h.setPolicy("sb1", &api.Policy{Allow: mustRules(t, "https://api.example.com:"+port+"/v1/ --method POST")})
	c := h.client("sb1", sb1Addr, serverAddr(t, srv))
	start := time.Now()
	resp, err := c.Post("https://api.example.com:"+port+"/v1/upload", "application/octet-stream", strings.NewReader(strings.Repeat("x", 1000)))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	ev := h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindHTTP })
	if ev.Action != "allow" || ev.Method != "POST" || ev.Path != "/v1/upload" || ev.Host != "api.example.com" ||
		ev.IP != publicAddr.String() || ev.Port != serverAddr(t, srv).Port() || ev.Status != 200 ||
		ev.Rule != "https://api.example.com:"+port+"/v1/ --method POST" || !strings.HasPrefix(ev.Reason, "allowed by") ||
		ev.BytesOut != 1000 || ev.BytesIn != 5000 || !ev.Intercepted || ev.Time.Before(start.Add(-time.Second)) || ev.DurationMS <= 0 {
		t.Fatalf("event %+v", ev)
	}
	c.CloseIdleConnections()
	conn := h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindTLS })
	if conn.Action != "allow" || !conn.Intercepted || conn.BytesOut < 1000 || conn.BytesIn < 5000 {
		t.Fatalf("connection event %+v", conn)
	}
}
