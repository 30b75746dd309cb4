package router

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/api"
	"github.com/paddock-dev/paddock/internal/clustertls"
	"github.com/paddock-dev/paddock/internal/e2b"
	"github.com/paddock-dev/paddock/internal/server"
)

var quiet = slog.New(slog.DiscardHandler)

const (
	clientToken = "client-token-0123456789"
	nodeToken   = "node-token-0123456789ab"
)

// loadTrust makes a cluster's TLS files and loads a node's side (for
// 127.0.0.1) and a gateway's.
func loadTrust(t testing.TB) (*clustertls.Node, *clustertls.Gateway) {
	t.Helper()
	dir := t.TempDir()
	if err := clustertls.Generate(dir, clustertls.GenerateOptions{}); err != nil {
		t.Fatal(err)
	}
	node, err := clustertls.LoadNode(dir, []string{"127.0.0.1"}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := clustertls.LoadGateway(dir, quiet)
	if err != nil {
		t.Fatal(err)
	}
	return node, gw
}

// serve serves h on a loopback port as a daemon's or gateway's TCP
// listener is served (connections bounded, unauthenticated ones closed
// after their answer), over TLS when cfg is given; it returns the address.
func serve(t testing.TB, h http.Handler, readTimeout time.Duration, cfg *tls.Config) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hc := server.HTTPConfig{ReadTimeout: readTimeout}
	hs := server.NewHTTPServer(h, hc, quiet)
	gl := server.Guard(hs, l, hc, quiet)
	if cfg != nil {
		gl = tls.NewListener(gl, cfg)
	}
	go hs.Serve(gl)
	t.Cleanup(func() { hs.Close() })
	return l.Addr().String()
}

// fakeNode answers the node API a gateway calls: the native API behind
// the node token, and envd calls that vouch for a caller holding the
// access token "right" (as internal/e2b does).
func fakeNode() (native, envd http.Handler) {
	native = server.RequireToken(nodeToken, quiet, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"id":%q}`, strings.TrimPrefix(r.URL.Path, "/v1/sandboxes/"))
	}))
	envd = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Access-Token") != "right" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set(e2b.VouchedHeader, "1")
		io.WriteString(w, "envd")
	})
	return native, envd
}

// rawCall sends one request on conn and reads its answer.
func rawCall(t *testing.T, conn net.Conn, br *bufio.Reader, req string) *http.Response {
	t.Helper()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatalf("sending: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// closedAfter reports whether the server closes conn (with nothing more
// to read) within a second.
func closedAfter(conn net.Conn, br *bufio.Reader) bool {
	conn.SetReadDeadline(time.Now().Add(time.Second))
	_, err := br.ReadByte()
	return err == io.EOF
}

// TestTrust: with the cluster's TLS a gateway reaches its nodes; a client
// holding the user's token (or the node's) cannot call a node directly;
// a node whose address is not https is left out.
func TestTrust(t *testing.T) {
	nodeTLS, gwTLS := loadTrust(t)
	native, _ := fakeNode()
	nodeAddr := serve(t, native, 0, nodeTLS.ServerConfig())
	plainAddr := serve(t, native, 0, nil)

	rt := New(Config{NodeTokens: tokens(t, nodeToken), TLS: gwTLS, Log: quiet})
	rt.SetNodes([]api.Node{
		{Name: "n1", Tag: "a", Address: "https://" + nodeAddr, State: api.NodeReady},
		{Name: "n2", Tag: "b", Address: "http://" + plainAddr, State: api.NodeReady},
	})
	gwAddr := serve(t, rt.Handler(tokens(t, clientToken)), 0, nil)

	get := func(c *http.Client, url, token string) (int, string, error) {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := get(http.DefaultClient, "http://"+gwAddr+"/v1/sandboxes/a1234", clientToken); err != nil || code != 200 || !strings.Contains(body, "a1234") {
		t.Fatalf("through the gateway: %d %q %v", code, body, err)
	}
	if code, body, _ := get(http.DefaultClient, "http://"+gwAddr+"/v1/sandboxes/b1234", clientToken); code != 404 || !strings.Contains(body, "the tags: a") {
		t.Errorf("a node at an http address with trust on: %d %q, want left out (404)", code, body)
	}

	// Straight to the node, with either token, over TLS that trusts the
	// node (or any certificate) but shows no gateway's: refused in the
	// handshake.
	for _, token := range []string{clientToken, nodeToken} {
		direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second}
		if code, body, err := get(direct, "https://"+nodeAddr+"/v1/sandboxes/a1234", token); err == nil {
			t.Errorf("a direct call with token %s.. answered %d %q", token[:6], code, body)
		} else if !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("a direct call: %v, want the handshake refused", err)
		}
	}
	if code, _, err := get(http.DefaultClient, "http://"+nodeAddr+"/v1/sandboxes/a1234", nodeToken); err == nil && code == 200 {
		t.Errorf("plain HTTP to the node's TLS listener answered 200")
	}
}

// TestVouchNotForged: a gateway counts an envd caller authenticated (its
// connection kept, without read deadlines) only when a node that proved
// itself says the caller held the sandbox's access token. A client that
// sends Paddock-Vouched itself, or a server at a node's address without
// the cluster's certificate that answers with it, gets no such thing.
func TestVouchNotForged(t *testing.T) {
	nodeTLS, gwTLS := loadTrust(t)
	_, envd := fakeNode()
	nodeE2B := serve(t, envd, 0, nodeTLS.ServerConfig())
	// An impostor: a server at an address a record names that holds no
	// certificate of the cluster's, takes any client and vouches for
	// everyone.
	impostor := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(e2b.VouchedHeader, "1")
		io.WriteString(w, "impostor")
	}))
	t.Cleanup(impostor.Close)

	rt := New(Config{NodeTokens: tokens(t, nodeToken), TLS: gwTLS, Log: quiet})
	rt.SetNodes([]api.Node{
		{Name: "n1", Tag: "a", Address: "https://127.0.0.1:1", E2BAddress: "https://" + nodeE2B, State: api.NodeReady},
		{Name: "evil", Tag: "e", Address: "https://127.0.0.1:1", E2BAddress: impostor.URL, State: api.NodeReady},
	})
	gwAddr := serve(t, rt.E2BHandler(tokens(t, clientToken)), -1, nil)

	envdCall := func(id, token string, extra string) string {
		return fmt.Sprintf("GET /files?path=x HTTP/1.1\r\nHost: gw\r\nE2b-Sandbox-Id: %s\r\nX-Access-Token: %s\r\n%s\r\n", id, token, extra)
	}
	for _, tc := range []struct {
		name       string
		req        string
		code       int
		kept       bool
		notVouched bool
	}{
		{"the access token", envdCall("a1234", "right", ""), 200, true, false},
		{"a wrong token", envdCall("a1234", "wrong", ""), 401, false, true},
		{"a wrong token and a forged header", envdCall("a1234", "wrong", e2b.VouchedHeader+": 1\r\n"), 401, false, true},
		{"an impostor node's vouch", envdCall("e1234", "right", ""), 503, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", gwAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			resp := rawCall(t, conn, br, tc.req)
			if resp.StatusCode != tc.code {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.code)
			}
			if resp.Header.Get(e2b.VouchedHeader) != "" {
				t.Errorf("the client saw %s", e2b.VouchedHeader)
			}
			if closed := closedAfter(conn, br); closed == tc.kept {
				t.Errorf("connection closed after the answer: %v, want %v", closed, !tc.kept)
			}
			if tc.kept {
				if resp := rawCall(t, conn, br, tc.req); resp.StatusCode != tc.code {
					t.Errorf("second call on the kept connection: %d", resp.StatusCode)
				}
			}
		})
	}
}
